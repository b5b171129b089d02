"""Float arithmetic: n-body gravitational simulation (5 bodies, symplectic Euler)."""

from _harness import SCALE, bench_main

PI = 3.14159265358979323
SOLAR_MASS = 4 * PI * PI
DAYS = 365.24


def bodies():
    return [
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], SOLAR_MASS],
        [[4.84143144246472090e+00, -1.16032004402742839e+00, -1.03622044471123109e-01],
         [1.66007664274403694e-03 * DAYS, 7.69901118419740425e-03 * DAYS, -6.90460016972063023e-05 * DAYS],
         9.54791938424326609e-04 * SOLAR_MASS],
        [[8.34336671824457987e+00, 4.12479856412430479e+00, -4.03523417114321381e-01],
         [-2.76742510726862411e-03 * DAYS, 4.99852801234917238e-03 * DAYS, 2.30417297573763929e-05 * DAYS],
         2.85885980666130812e-04 * SOLAR_MASS],
        [[1.28943695621391310e+01, -1.51111514016986312e+01, -2.23307578892655734e-01],
         [2.96460137564761618e-03 * DAYS, 2.37847173959480950e-03 * DAYS, -2.96589568540237556e-05 * DAYS],
         4.36624404335156298e-05 * SOLAR_MASS],
        [[1.53796971148509165e+01, -2.59193146099879641e+01, 1.79258772950371181e-01],
         [2.68067772490389322e-03 * DAYS, 1.62824170038242295e-03 * DAYS, -9.51592254519715870e-05 * DAYS],
         5.15138902046611451e-05 * SOLAR_MASS],
    ]


def pairs(bs):
    out = []
    for i in range(len(bs)):
        for j in range(i + 1, len(bs)):
            out.append((bs[i], bs[j]))
    return out


def advance(bs, prs, dt, n):
    for _ in range(n):
        for ((r1, v1, m1), (r2, v2, m2)) in prs:
            dx = r1[0] - r2[0]
            dy = r1[1] - r2[1]
            dz = r1[2] - r2[2]
            mag = dt * ((dx * dx + dy * dy + dz * dz) ** -1.5)
            b1m = m1 * mag
            b2m = m2 * mag
            v1[0] -= dx * b2m
            v1[1] -= dy * b2m
            v1[2] -= dz * b2m
            v2[0] += dx * b1m
            v2[1] += dy * b1m
            v2[2] += dz * b1m
        for (r, (vx, vy, vz), m) in bs:
            r[0] += dt * vx
            r[1] += dt * vy
            r[2] += dt * vz


def energy(bs, prs):
    e = 0.0
    for ((r1, v1, m1), (r2, v2, m2)) in prs:
        dx = r1[0] - r2[0]
        dy = r1[1] - r2[1]
        dz = r1[2] - r2[2]
        e -= (m1 * m2) / ((dx * dx + dy * dy + dz * dz) ** 0.5)
    for (r, (vx, vy, vz), m) in bs:
        e += m * (vx * vx + vy * vy + vz * vz) / 2.0
    return e


def run(scale):
    steps = max(10, int(100000 * scale))
    bs = bodies()
    prs = pairs(bs)
    px = py = pz = 0.0
    for (r, (vx, vy, vz), m) in bs:
        px -= vx * m
        py -= vy * m
        pz -= vz * m
    v = bs[0][1]
    v[0], v[1], v[2] = px / SOLAR_MASS, py / SOLAR_MASS, pz / SOLAR_MASS
    e0 = energy(bs, prs)
    advance(bs, prs, 0.01, steps)
    return "%.9f %.9f" % (e0, energy(bs, prs))


if __name__ == "__main__":
    bench_main(run)

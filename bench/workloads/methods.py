"""Method dispatch: class hierarchy, virtual calls, super(), properties, classmethods."""

from _harness import SCALE, bench_main


class Shape:
    def __init__(self, k):
        self.k = k

    def area(self):
        return 0

    def scaled(self, f):
        return self.area() * f

    @property
    def kind(self):
        return self.k % 3

    @classmethod
    def unit(cls):
        return cls(1)


class Rect(Shape):
    def __init__(self, k, w, h):
        super().__init__(k)
        self.w = w
        self.h = h

    def area(self):
        return self.w * self.h


class Square(Rect):
    def __init__(self, k, s):
        super().__init__(k, s, s)

    def area(self):
        return super().area() + 1


class Tri(Shape):
    def __init__(self, k, b, h):
        Shape.__init__(self, k)
        self.b = b
        self.h = h

    def area(self):
        return (self.b * self.h) >> 1


class Counter:
    __slots__ = ("n",)

    def __init__(self):
        self.n = 0

    def inc(self, by):
        self.n += by
        return self

    def get(self):
        return self.n


def run(scale):
    reps = max(1, int(3200 * scale))
    c = Counter()
    acc = 0
    for r in range(reps):
        shapes = []
        for i in range(200):
            m = i % 3
            if m == 0:
                shapes.append(Rect(i, i % 7, i % 11))
            elif m == 1:
                shapes.append(Square(i, i % 5))
            else:
                shapes.append(Tri(i, i % 13, i % 9))
        for s in shapes:
            acc += s.area() + s.scaled(2) + s.kind
            c.inc(1).inc(2)
        acc += Shape.unit().k
    return acc + c.get()


if __name__ == "__main__":
    bench_main(run)

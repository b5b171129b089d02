"""Richards-like OS scheduler simulation: task control blocks on a priority list,
packets passed between an idle task, a worker, two handlers and two devices.
(Own implementation of the classic idea; not a port of any benchmark suite.)"""

from _harness import SCALE, bench_main

IDLE, WORKER, HANDLER_A, HANDLER_B, DEVICE_A, DEVICE_B = range(6)
KIND_DEVICE, KIND_WORK = 0, 1
BUFSIZE = 4


class Packet:
    __slots__ = ("link", "ident", "kind", "datum", "data")

    def __init__(self, link, ident, kind):
        self.link = link
        self.ident = ident
        self.kind = kind
        self.datum = 0
        self.data = [0] * BUFSIZE

    def append_to(self, queue):
        self.link = None
        if queue is None:
            return self
        p = queue
        while p.link is not None:
            p = p.link
        p.link = self
        return queue


class Task:
    def __init__(self, sched, ident, prio, wkq, waiting, held):
        self.sched = sched
        self.ident = ident
        self.prio = prio
        self.wkq = wkq
        self.packet_pending = wkq is not None
        self.waiting = waiting
        self.held = held
        self.link = sched.list_head
        sched.list_head = self
        sched.table[ident] = self

    def take_packet(self):
        pkt = self.wkq
        if pkt is None:
            return None
        self.wkq = pkt.link
        self.packet_pending = self.wkq is not None
        self.waiting = False
        return pkt

    def add_packet(self, pkt, current):
        if self.wkq is None:
            self.wkq = pkt
            self.packet_pending = True
            self.waiting = False
            pkt.link = None
            if self.prio > current.prio:
                return self
        else:
            self.wkq = pkt.append_to(self.wkq)
        return current


class IdleTask(Task):
    def __init__(self, sched, ident, prio):
        super().__init__(sched, ident, prio, None, False, False)
        self.v1 = 1
        self.count = 1000

    def step(self, pkt):
        s = self.sched
        self.count -= 1
        if self.count == 0:
            return s.hold_self()
        if self.v1 & 1 == 0:
            self.v1 >>= 1
            return s.release(DEVICE_A)
        self.v1 = (self.v1 >> 1) ^ 0xD008
        return s.release(DEVICE_B)


class WorkerTask(Task):
    def __init__(self, sched, ident, prio, wkq):
        super().__init__(sched, ident, prio, wkq, True, False)
        self.dest = HANDLER_A
        self.n = 0

    def step(self, pkt):
        s = self.sched
        if pkt is None:
            return s.wait()
        self.dest = HANDLER_B if self.dest == HANDLER_A else HANDLER_A
        pkt.ident = self.dest
        pkt.datum = 0
        for i in range(BUFSIZE):
            self.n += 1
            if self.n > 26:
                self.n = 1
            pkt.data[i] = 64 + self.n
        return s.send(pkt)


class HandlerTask(Task):
    def __init__(self, sched, ident, prio, wkq):
        super().__init__(sched, ident, prio, wkq, True, False)
        self.work_in = None
        self.dev_in = None

    def step(self, pkt):
        s = self.sched
        if pkt is not None:
            if pkt.kind == KIND_WORK:
                self.work_in = pkt.append_to(self.work_in)
            else:
                self.dev_in = pkt.append_to(self.dev_in)
        w = self.work_in
        if w is not None:
            count = w.datum
            if count < BUFSIZE:
                d = self.dev_in
                if d is not None:
                    self.dev_in = d.link
                    d.datum = w.data[count]
                    w.datum = count + 1
                    return s.send(d)
            else:
                self.work_in = w.link
                return s.send(w)
        return s.wait()


class DeviceTask(Task):
    def __init__(self, sched, ident, prio):
        super().__init__(sched, ident, prio, None, True, False)
        self.pending = None

    def step(self, pkt):
        s = self.sched
        if pkt is None:
            p = self.pending
            if p is None:
                return s.wait()
            self.pending = None
            return s.send(p)
        self.pending = pkt
        s.hold_count += 1
        return s.hold_self()


class Scheduler:
    def __init__(self):
        self.list_head = None
        self.table = [None] * 6
        self.current = None
        self.hold_count = 0
        self.qpkt_count = 0

    def hold_self(self):
        self.hold_count += 1
        self.current.held = True
        return self.current.link

    def release(self, ident):
        t = self.table[ident]
        t.held = False
        if t.prio > self.current.prio:
            return t
        return self.current

    def wait(self):
        self.current.waiting = True
        return self.current

    def send(self, pkt):
        t = self.table[pkt.ident]
        self.qpkt_count += 1
        pkt.link = None
        pkt.ident = self.current.ident
        return t.add_packet(pkt, self.current)

    def schedule(self):
        self.current = self.list_head
        while self.current is not None:
            t = self.current
            if t.held or (t.waiting and not t.packet_pending):
                self.current = t.link
                continue
            pkt = None
            if t.waiting and t.packet_pending:
                pkt = t.take_packet()
            elif t.packet_pending and not t.waiting:
                pkt = t.take_packet()
            self.current = t.step(pkt)


def one_run():
    s = Scheduler()
    IdleTask(s, IDLE, 0)
    wq = Packet(None, 0, KIND_WORK)
    wq = Packet(wq, 0, KIND_WORK)
    WorkerTask(s, WORKER, 1000, wq)
    wq = Packet(None, DEVICE_A, KIND_DEVICE)
    wq = Packet(wq, DEVICE_A, KIND_DEVICE)
    wq = Packet(wq, DEVICE_A, KIND_DEVICE)
    HandlerTask(s, HANDLER_A, 2000, wq)
    wq = Packet(None, DEVICE_B, KIND_DEVICE)
    wq = Packet(wq, DEVICE_B, KIND_DEVICE)
    wq = Packet(wq, DEVICE_B, KIND_DEVICE)
    HandlerTask(s, HANDLER_B, 3000, wq)
    DeviceTask(s, DEVICE_A, 4000)
    DeviceTask(s, DEVICE_B, 5000)
    s.schedule()
    return s.qpkt_count * 100000 + s.hold_count


def run(scale):
    reps = max(1, int(140 * scale))
    acc = 0
    for _ in range(reps):
        acc += one_run()
    return acc


if __name__ == "__main__":
    bench_main(run)

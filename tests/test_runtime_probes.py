"""The GIL, thread, asyncio task and instance probes against their ground
truth.

data/runtime_workload.py runs threads that contend for the GIL, block in
time.sleep() and on a lock, and asyncio tasks whose steps it knows, and
prints what each thread and task is.  bpftrace runs it with the probes
armed; per thread, the GIL probes must follow take__start, take__done,
drop in that order, thread__start/stop must fire once per started thread
with its ids, around all of its Python code and before its join() returns,
and the task step probes must bracket each step the workload counts.  The
four instance probes must fire once per instance of the classes that a
workload creates and frees, by name and module.  On stock 3.13.5 the
probes other than upstream's instance probes do not exist and bpftrace
cannot attach; upstream declares those but never fires them.
"""

import collections
import os
import shutil
import tempfile
import unittest

from support import Bpftrace, PYTHON, free_threaded, run, tracer_unusable

WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                        "runtime_workload.py")

# @gil[tid]: 0 without the GIL (or before the first event), 1 taking it,
# 2 holding it; @bad counts the events that arrive in another state.
# (bpftrace 0.17's min() loses values above 32 bits, such as nsecs: the
# first entry is kept by hand.)
THREADS_PROGRAM = """
usdt:%(p)s:python:gil__take__start /pid == cpid/
{ if (@gil[tid] != 0) { @bad[tid, "take__start"] = count(); }
  @gil[tid] = 1; @take_start[tid] = count(); }
usdt:%(p)s:python:gil__take__done /pid == cpid/
{ if (@gil[tid] != 1) { @bad[tid, "take__done"] = count(); }
  @gil[tid] = 2; @take_done[tid] = count(); }
usdt:%(p)s:python:gil__drop /pid == cpid/
{ if (@gil[tid] != 2) { @bad[tid, "drop"] = count(); }
  @gil[tid] = 0; @drop[tid] = count(); }
usdt:%(p)s:python:thread__start /pid == cpid/
{ printf("START %%d %%lu %%lu %%llu\\n", tid, arg0, arg1, nsecs); }
usdt:%(p)s:python:thread__stop /pid == cpid/
{ printf("STOP %%d %%lu %%lu %%llu\\n", tid, arg0, arg1, nsecs); }
usdt:%(p)s:python:function__entry /pid == cpid && @first_entry[tid] == 0/
{ @first_entry[tid] = nsecs; }
usdt:%(p)s:python:function__return /pid == cpid/
{ @last_return[tid] = max(nsecs); }
usdt:%(p)s:python:function__entry /pid == cpid && str(arg1) == "joined"/
{ printf("JOINED_AT %%llu\\n", nsecs); }
END { clear(@gil); }
"""
TASKS_PROGRAM = """
usdt:%(p)s:python:task__step__start /pid == cpid/
{ printf("STEP %%llu %%d start|%%s|%%s\\n", nsecs, tid, str(arg0),
         str(arg1)); }
usdt:%(p)s:python:task__step__done /pid == cpid/
{ printf("STEP %%llu %%d done|%%s|%%s\\n", nsecs, tid, str(arg0),
         str(arg1)); }
"""


def run_workload(program, mode):
    """([fields of each output line], {map: {key: value}}) of the workload
    run under bpftrace (a key is a tid, or a tuple of several fields)."""
    reason = Bpftrace.usable()
    if reason is not None:
        tracer_unusable(reason)
    env = dict(os.environ, RUNTIME_MODE=mode)
    proc = Bpftrace.run(program % {"p": PYTHON}, WORKLOAD, env=env)
    if proc.returncode != 0:
        raise AssertionError("bpftrace exit %d: %s"
                             % (proc.returncode, Bpftrace.errors(proc)))
    lines = [line.split() for line in proc.stdout.splitlines()]
    maps = collections.defaultdict(dict)
    for name, keys, value in Bpftrace.maps(proc.stdout):
        maps[name][tuple(keys) if len(keys) > 1 else int(keys[0])] = value
    return lines, maps


class ThreadsAndGil(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        # One bpftrace run serves every test of the class.
        cls.lines, cls.maps = run_workload(THREADS_PROGRAM, "threads")
        cls.free_threaded = free_threaded()

    def setUp(self):
        ((_, main),) = self.tagged("MAIN")
        self.main = int(main)
        # {native id: (name, ident)} of the started threads, all joined.
        self.threads = {int(native): (name, int(ident))
                        for _, name, ident, native in self.tagged("THREAD")}
        self.joined = [int(ident) for _, ident in self.tagged("JOINED")]
        self.assertTrue(self.threads)
        self.assertEqual(sorted(ident for _, ident in self.threads.values()),
                         sorted(self.joined))

    def tagged(self, tag):
        """The output lines (as fields) that start with tag."""
        return [fields for fields in self.lines if fields[:1] == [tag]]

    def events(self, tag):
        """{tid: [(thread_id arg, native_id arg, nsecs)]} of START/STOP."""
        found = collections.defaultdict(list)
        for _, tid, ident, native, nsecs in self.tagged(tag):
            found[int(tid)].append((int(ident), int(native), int(nsecs)))
        return found

    def test_gil_events_in_order(self):
        if self.free_threaded:
            # No GIL, no GIL probes (even with the GIL enabled at run time).
            self.assertEqual([self.maps[name] for name in
                              ("take_start", "take_done", "drop")],
                             [{}, {}, {}])
            return
        self.assertEqual(self.maps["bad"], {})
        take_start = self.maps["take_start"]
        take_done = self.maps["take_done"]
        drop = self.maps["drop"]
        self.assertEqual(set(take_start), {self.main, *self.threads})
        self.assertEqual(take_done, take_start)
        for tid, taken in take_done.items():
            if tid == self.main:
                # It may end holding the GIL, never more than once.
                self.assertIn(taken - drop.get(tid, 0), (0, 1))
            else:
                # A started thread leaves without the GIL.
                self.assertEqual(drop.get(tid), taken, self.threads[tid])
        # The workload really switched: every started thread had to wait
        # for the GIL again at least once (the spinners are preempted, the
        # others block).
        for tid, (name, _) in self.threads.items():
            self.assertGreater(take_done[tid], 1, name)

    def test_thread_start_stop_once_with_ids(self):
        for tag in ("START", "STOP"):
            found = self.events(tag)
            self.assertEqual(set(found), set(self.threads), tag)
            for tid, ((ident, native, _),) in found.items():
                self.assertEqual((ident, native),
                                 (self.threads[tid][1], tid),
                                 (tag, self.threads[tid]))

    def test_thread_start_stop_around_python_code(self):
        starts, stops = self.events("START"), self.events("STOP")
        first_entry = self.maps["first_entry"]
        last_return = self.maps["last_return"]
        for tid, (name, _) in self.threads.items():
            ((_, _, started),), ((_, _, stopped),) = starts[tid], stops[tid]
            self.assertLess(started, first_entry[tid], name)
            self.assertLess(last_return[tid], stopped, name)

    def test_thread_stop_before_join_returns(self):
        # The main thread joins the threads one by one, and enters joined()
        # after each join.
        stops = {self.threads[tid][1]: stopped
                 for tid, ((_, _, stopped),) in self.events("STOP").items()}
        joined_at = sorted(int(nsecs) for _, nsecs in self.tagged("JOINED_AT"))
        self.assertEqual(len(joined_at), len(self.joined))
        for ident, returned in zip(self.joined, joined_at):
            self.assertLess(stops[ident], returned, ident)


class TaskSteps(unittest.TestCase):

    def test_steps_equal_ground_truth(self):
        lines, _ = run_workload(TASKS_PROGRAM, "asyncio")
        expected = {}
        for fields in lines:
            if fields[:1] == ["STEPS"]:
                _, name, qualname, starts, dones = fields
                expected[name, qualname] = (int(starts), int(dones))
        renamed = {tuple(fields[1:]) for fields in lines
                   if fields[:1] == ["RENAMED"]}
        eager = {fields[1] for fields in lines if fields[:1] == ["EAGER"]}
        # The workload ran what it says: named and default-named tasks
        # ("Task-N"; the sleeps() ones never call get_name()), a renamed
        # one, eager ones and one whose awaitable is not a coroutine.
        self.assertTrue(any(name.startswith("Task-") for name, _ in expected),
                        expected)
        self.assertTrue(renamed and eager, lines)
        self.assertIn(("manual", "<unknown>"), expected)

        steps = sorted((int(nsecs), int(tid), event.split("|"))
                       for _, nsecs, tid, event in
                       (f for f in lines if f[:1] == ["STEP"]))
        self.assertEqual(len({tid for _, tid, _ in steps}), 1,
                         "all steps run in the event loop's thread")
        found = collections.defaultdict(lambda: [0, 0])
        running = []            # (name, qualname) of the steps under way
        nested = set()          # tasks whose first step ran inside another
        for _, _, (event, name, qualname) in steps:
            if event == "start":
                if running and found[name, qualname] == [0, 0]:
                    nested.add(name)
                found[name, qualname][0] += 1
                running.append((name, qualname))
            else:
                found[name, qualname][1] += 1
                # A step ends before the step it runs inside of (an eager
                # first step), and under the name it started with unless
                # the task renamed itself during the step.
                self.assertTrue(running, (name, qualname))
                top_name, top_qualname = running.pop()
                self.assertEqual(top_qualname, qualname)
                self.assertIn((top_name, name),
                              {(name, name)} | renamed)
        self.assertEqual(running, [])
        found = {key: tuple(count) for key, count in found.items()}
        for key, count in expected.items():
            self.assertEqual(found.get(key, (0, 0)), count, key)
        # Tasks the workload does not count (asyncio.run's own) balance.
        for key, (starts, dones) in found.items():
            if key not in expected:
                self.assertEqual(starts, dones, key)
        self.assertEqual(nested, eager)



INSTANCES_WORKLOAD = """\
import gc

class Widget:
    pass

class Gadget:
    __slots__ = ("x",)

widgets = [Widget() for _ in range(300)]
del widgets
gadgets = [Gadget() for _ in range(150)]
for gadget in gadgets:
    gadget.x = gadget
del gadget, gadgets
gc.collect()
"""
INSTANCES_PROGRAM = """
usdt:%(p)s:python:instance__new__start /pid == cpid && str(arg1) == "__main__"/
{ @new_start[str(arg0)] = count(); }
usdt:%(p)s:python:instance__new__done /pid == cpid && str(arg1) == "__main__"/
{ @new_done[str(arg0)] = count(); }
usdt:%(p)s:python:instance__delete__start /pid == cpid && str(arg1) == "__main__"/
{ @delete_start[str(arg0)] = count(); }
usdt:%(p)s:python:instance__delete__done /pid == cpid && str(arg1) == "__main__"/
{ @delete_done[str(arg0)] = count(); }
"""


class InstanceProbes(unittest.TestCase):

    def test_once_per_instance(self):
        # 300 Widgets freed by reference counting, 150 Gadgets (with
        # __slots__, each in a cycle) freed by the collector: each of the
        # four probes fires once per instance, with the class's name and
        # module.
        reason = Bpftrace.usable()
        if reason is not None:
            tracer_unusable(reason)
        tmp = tempfile.mkdtemp(prefix="instances")
        self.addCleanup(shutil.rmtree, tmp)
        script = os.path.join(tmp, "instances.py")
        with open(script, "w") as f:
            f.write(INSTANCES_WORKLOAD)
        proc = Bpftrace.run(INSTANCES_PROGRAM % {"p": PYTHON}, script)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        counts = collections.defaultdict(dict)
        for name, keys, value in Bpftrace.maps(proc.stdout):
            counts[name][keys[0]] = value
        expected = {"Widget": 300, "Gadget": 150}
        for probe in ("new_start", "new_done", "delete_start",
                      "delete_done"):
            with self.subTest(probe=probe):
                self.assertEqual(counts[probe], expected, proc.stdout)


if __name__ == "__main__":
    unittest.main()

"""Programs whose output must not change when a tracer arms the probes.

Each case prints what Python code can observe; tests/test_invisible.py runs
a case unarmed and with every probe armed and compares the two outputs.
usage: invisible_workload.py CASE, or the case in $INVISIBLE_CASE (bpftrace's
-c cannot pass a second argument from the tests' helper)
"""

import sys


def case_instance_eq():
    # type_module_name() must not call the __eq__ of a str subclass key of
    # the type dict (it could raise, or create instances recursively).
    calls = []

    class Key(str):
        armed = False

        def __eq__(self, other):
            if Key.armed:
                calls.append(other)
                Plain()             # re-enters the instance probes
                raise RuntimeError("__eq__ called")
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    class Plain:
        pass

    cls = type("E", (), {Key("__module__"): "mod"})
    Key.armed = True
    objs = [cls() for _ in range(5)]
    del objs
    print("instances", len(calls))
    print("unrelated", len([1, 2, 3]))


def case_import_surrogate():
    for name in ("nonexistent_\udcff", "nonexistent_\udcff.sub"):
        try:
            __import__(name)
        except Exception as exc:
            print(type(exc).__name__)


def case_audit():
    print(sys.audit(123), sys.audit("\udcff", 1), sys.audit("ok", "x"))
    try:
        sys.audit()
    except TypeError as exc:
        print("TypeError", exc)


def case_all_events():
    print(sys.monitoring._all_events())
    sys.setprofile(lambda *args: None)
    profiled = sys.monitoring._all_events()
    sys.setprofile(None)
    print(sorted(profiled), sys.monitoring._all_events())


def case_pdb_opcodes():
    # What bdb.set_trace() does: f_trace_opcodes first, then sys.settrace().
    events = []

    def tracer(frame, event, arg):
        events.append(event)
        return tracer

    def traced():
        frame = sys._getframe()
        frame.f_trace = tracer
        frame.f_trace_opcodes = True
        sys.settrace(tracer)
        a = 1
        b = a + 1
        sys.settrace(None)
        return b

    traced()
    print(events)


def case_subinterpreter():
    import _interpreters
    interp = _interpreters.create()
    try:
        _interpreters.run_string(interp, (
            "def sub_func():\n"
            "    return 1\n"
            "for _ in range(7):\n"
            "    sub_func()\n"))
    finally:
        _interpreters.destroy(interp)
    print("subinterpreter done")


def case_modules():
    # The modules that ran Python code during start-up, with the file name
    # their <module> frame has (printed for the start-up test).
    seen = set()
    for name, mod in sorted(sys.modules.items()):
        if id(mod) in seen:     # os.path is posixpath: one <module> frame
            continue
        seen.add(id(mod))
        spec = getattr(mod, "__spec__", None)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "get_code"):
            continue
        try:
            code = loader.get_code(name)
        except Exception:
            continue
        if code is not None:
            print("module", name, code.co_filename)


def case_threads():
    import os
    for tid in sorted(os.listdir("/proc/self/task")):
        with open("/proc/self/task/%s/comm" % tid) as f:
            print("thread", f.read().strip())


if __name__ == "__main__":
    import os
    case = sys.argv[1] if len(sys.argv) > 1 else os.environ["INVISIBLE_CASE"]
    globals()["case_" + case]()

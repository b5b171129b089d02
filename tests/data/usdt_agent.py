"""A process that runs the code tests/test_usdt_module.py sends it.

Each line on stdin is a JSON string of Python code, run in the namespace of
one module, "agent_code" (with usdt, os, sys, threading and time imported,
and registered in sys.modules so that pickle finds the functions it
defines by reference); the answer is one JSON
line on stdout: {"ok": the value the code left in `_`, or null} or
{"error": exception type name, "message": str(exception)}.
"""

import json
import os
import sys
import threading
import time
import types

import usdt

module = sys.modules["agent_code"] = types.ModuleType("agent_code")
namespace = module.__dict__
namespace.update(usdt=usdt, os=os, sys=sys, threading=threading, time=time)
out = sys.stdout
print(json.dumps({"ok": os.getpid()}), file=out, flush=True)
for line in sys.stdin:
    namespace.pop("_", None)
    try:
        exec(json.loads(line), namespace)
        answer = {"ok": namespace.get("_")}
    except Exception as exc:
        answer = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(answer), file=out, flush=True)

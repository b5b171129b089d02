"""A small HTTP server with application probes, defined with the usdt module.

    python examples/http_routes.py [PORT]      (default 8000; 0: any free port)

It prints its PID and address, and serves until Ctrl-C.  Routes: / (a
greeting), /users/<id> (a user as JSON, or 404) and /slow (50 ms); any
other path is the route "-" (404).  While a tracer is attached, each
request fires myapp:request__start(route, method) and
myapp:request__done(route, status), and each user lookup
myapp:load_user__entry and myapp:load_user__return; the ready script
examples/http_routes.bt times the requests per route and status:

    bpftrace -p PID examples/http_routes.bt
"""

import http.server
import json
import os
import re
import sys
import time

import usdt

request_start = usdt.Probe("myapp", "request__start", (str, str))
request_done = usdt.Probe("myapp", "request__done", (str, int))

USERS = {1: "ada", 2: "grace", 3: "linus"}


@usdt.traced("myapp")                   # myapp:load_user__entry, __return
def load_user(user_id):
    time.sleep(0.002)                   # as if asking a database
    return USERS.get(user_id)


def index():
    return 200, {"hello": "world"}


def user(user_id):
    name = load_user(int(user_id))
    if name is None:
        return 404, {"error": "no such user"}
    return 200, {"id": int(user_id), "name": name}


def slow():
    time.sleep(0.05)
    return 200, {"slept_ms": 50}


def not_found():
    return 404, {"error": "no such route"}


# (route, the paths it matches, its handler)
ROUTES = [("/", re.compile(r"/"), index),
          ("/users/<id>", re.compile(r"/users/(\d+)"), user),
          ("/slow", re.compile(r"/slow"), slow)]


def find_route(path):
    """(route, handler, arguments) for path."""
    for route, pattern, handler in ROUTES:
        match = pattern.fullmatch(path)
        if match:
            return route, handler, match.groups()
    return "-", not_found, ()


class Handler(http.server.BaseHTTPRequestHandler):

    def do_GET(self):
        route, handler, args = find_route(self.path)
        if request_start:               # only while a tracer is attached
            request_start(route, self.command)
        status, body = handler(*args)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if request_done:
            request_done(route, status)

    def log_message(self, format, *args):
        pass                            # the tracer is the log


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("pid %d serving on http://127.0.0.1:%d/"
          % (os.getpid(), server.server_port), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:           # Ctrl-C: exit quietly
        server.server_close()

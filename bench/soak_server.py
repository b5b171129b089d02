"""The server that bench/soak_profile.py profiles from outside, again and
again, under load.

usage: soak_server.py [LIMIT_S]

An http.server.ThreadingHTTPServer on 127.0.0.1, on a free port, with a
thread per connection; connections are kept alive (HTTP/1.1).  GET
/work?n=N computes work(N), about a millisecond of Python calls three
levels deep for the N the client sends, and answers its value in decimal,
one line.  Any other request is answered 404.  Nothing is logged per
request: what the server writes on stderr is an error.

Once listening it writes "ready PID PORT".  When its standard input
closes it stops serving and exits; SIGALRM ends it after LIMIT_S seconds
(default 3600) whatever the driver does.
"""

import http.server
import os
import signal
import sys
import threading


def term(i):
    return i * i % 7


def chunk(start, stop):
    total = 0
    for i in range(start, stop):
        total += term(i)
    return total


def work(n):
    return sum(chunk(start, min(start + 100, n))
               for start in range(0, n, 100))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The headers and the body go in two writes: with Nagle's algorithm
    # the body would wait for the client's delayed ACK of the headers
    # (40 ms), and the server would idle.
    disable_nagle_algorithm = True

    def do_GET(self):
        path, _, query = self.path.partition("?")
        name, _, value = query.partition("=")
        if path != "/work" or name != "n" or not value.isdigit():
            self.send_error(404)
            return
        body = b"%d\n" % work(int(value))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


def stop_on_eof(server):
    sys.stdin.read()
    server.shutdown()


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 3600
    signal.alarm(limit)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=stop_on_eof, args=(server,), daemon=True).start()
    os.write(1, b"ready %d %d\n" % (os.getpid(), server.server_address[1]))
    with server:
        server.serve_forever()


if __name__ == "__main__":
    main()

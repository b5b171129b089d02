"""Soak: a live server profiled from outside, again and again, unharmed.

bench/soak_server.py (an http.server.ThreadingHTTPServer doing about a
millisecond of Python calls per request) runs under PYTHON on 127.0.0.1,
and CLIENTS threads of this process keep it busy over loopback with
http.client: each sends GET /work?n=N on a kept-alive connection, checks
the answer against the value it computed itself, and opens a new
connection every 50 requests (so the server also starts and ends
threads).  A request whose answer is not 200 with the right value, or
that raises (a refused connection, a reset, a timeout after
--request-timeout seconds), is a failed one.

After --settle seconds of load, SESSIONS sessions of

    usdt.stacks --json --probe profile:hz:99 --save RECORDS -p SERVER_PID

run one after another, each: started, attached (its first record is in
RECORDS), left to sample for --seconds, sent SIGINT, and waited for; all
of it within --session-timeout seconds.  A session is ok if the tool
exits with status 0, leaves no process of its own behind (bpftrace ends
with it) nor a file in its TMPDIR (one of this run's), and prints
stacks, one of which at least names the server's work().  The load goes
on throughout.

Before the first session and after the last one, each time after
--settle seconds of load, the clients pause (each ends its request in
flight and closes its connection) until the server's thread and fd
counts have stayed the same for a second; then the server's RSS (VmRSS),
open fds (/proc/PID/fd), threads and TracerPid are read, and the clients
go on.  Pausing for the reading leaves the server with its own threads
and fds only, not those of the connections in flight, so both counts
must come out the same after as before.  The RSS gets a tolerance,
--rss-tolerance-kib (default 2048), for the same work does not leave the
same RSS twice: pymalloc gives an arena back to the system only once all
of it is free, glibc's malloc keeps what is freed in its arenas and the
stacks of ended threads in its cache, and the server's own caches (the
interpreter's freelists, type cache and specialized instructions, and
those of the library modules it runs) fill as the requests come, at
other moments in each run.  2 MiB over 100 sessions is 20 KiB per
session, or 100 bytes per sample at 200 samples per session (99 Hz for
2 s of a busy CPU).  --sessions 0 is the control: the same run, nothing
attached.

Exit status 1 if any session failed, any request failed, the fds or
threads differ from before, the RSS grew by more than the tolerance, the
server is traced (TracerPid) or wrote on stderr or did not exit cleanly,
or --max-seconds ran out before SESSIONS sessions (the run stops early
and says so).  Everything started here (server, tools) is ended on the
way out, on error and on Ctrl-C too.

usage: python3 bench/soak_profile.py [PYTHON] [--sessions N] [--seconds S]
           [--max-seconds S] [--out-json F] ...
PYTHON defaults to build/3.13/obj/python.  Run as root (bpftrace).
"""

import argparse
import collections
import http.client
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
TOOL = os.path.join(TOP, "overlay", "Lib", "usdt", "stacks")
SERVER = os.path.join(HERE, "soak_server.py")
DEFAULT_PYTHON = os.path.join(TOP, "build", "3.13", "obj", "python")
HOST = "127.0.0.1"
# Requests per connection: the server starts a thread per connection.
PER_CONNECTION = 50
# The work per request: work(N) takes about a millisecond at these N on
# the build tree's interpreter; each client sends its own.
WORK_N = 8000
# The server's functions that a sample of it under load names.
SERVER_FUNCTIONS = {"work", "chunk", "term"}
# The server is quiet once its threads and fds stay the same this long;
# it must be within QUIET_MAX_S of the clients' pause.
QUIET_S = 1.0
QUIET_MAX_S = 20.0
# How long a tool that did not end on SIGINT gets to end on SIGTERM.
TOOL_GRACE_S = 5.0
STDERR_TAIL = 2000

T_START = time.monotonic()


def log(msg):
    print("[%7.1fs] %s" % (time.monotonic() - T_START, msg),
          file=sys.stderr, flush=True)


def interrupt(signum, frame):
    raise KeyboardInterrupt


class Load:
    """The client threads, and what they counted."""

    def __init__(self, port, clients, timeout):
        self.port = port
        self.timeout = timeout
        self.counts = collections.Counter()
        self.failures = collections.Counter()
        # The slowest answer (s) by phase: "outside" or "sessions", as
        # run_sessions() sets it.
        self.phase = "outside"
        self.slowest = {}
        self.cond = threading.Condition()
        self.running = True
        self.stopped = False
        self.active = clients
        self.threads = [threading.Thread(target=self._client,
                                         args=(WORK_N + 500 * k,),
                                         daemon=True)
                        for k in range(clients)]
        for thread in self.threads:
            thread.start()

    def _client(self, n):
        expected = b"%d\n" % sum(i * i % 7 for i in range(n))
        path = "/work?n=%d" % n
        while True:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.running or self.stopped)
                if self.stopped:
                    return
                self.active += 1
            if not self._connection(path, expected):
                # Not at full speed against a server that refuses.
                time.sleep(0.1)

    def _connection(self, path, expected):
        """Up to PER_CONNECTION requests on one connection; False after
        a failed one."""
        connection = http.client.HTTPConnection(HOST, self.port,
                                                timeout=self.timeout)
        try:
            for _ in range(PER_CONNECTION):
                if not self.running:
                    return True
                self._count("sent")
                start = time.monotonic()
                try:
                    connection.request("GET", path)
                    response = connection.getresponse()
                    body = response.read()
                except (OSError, http.client.HTTPException) as error:
                    self._count("failed", type(error).__name__)
                    return False
                elapsed = time.monotonic() - start
                if response.status != 200:
                    self._count("failed", "status %d" % response.status)
                    return False
                if body != expected:
                    self._count("failed", "wrong answer")
                    return False
                self._count("answered", elapsed=elapsed)
            return True
        finally:
            connection.close()

    def _count(self, what, failure=None, elapsed=0.0):
        with self.cond:
            self.counts[what] += 1
            if failure:
                self.failures[failure] += 1
            self.slowest[self.phase] = max(
                self.slowest.get(self.phase, 0.0), elapsed)

    def pause(self):
        """Stop sending, and wait until every request in flight is done
        and every connection closed; whether they were."""
        with self.cond:
            self.running = False
            return self.cond.wait_for(lambda: self.active == 0,
                                      self.timeout + 5)

    def resume(self):
        with self.cond:
            self.running = True
            self.cond.notify_all()

    def stop(self):
        self.pause()
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join(self.timeout + 5)


def server_state(pid):
    """The server's RSS (KiB), threads, open fds and TracerPid, from
    /proc; ProcessLookupError once it has ended."""
    try:
        with open("/proc/%d/status" % pid) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        if "VmRSS" not in fields:
            # A zombie: it has ended, and is not reaped yet.
            raise ProcessLookupError(pid)
        fds = len(os.listdir("/proc/%d/fd" % pid))
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    return {"rss_kib": int(fields["VmRSS"].split()[0]),
            "threads": int(fields["Threads"]),
            "fds": fds,
            "tracer_pid": int(fields["TracerPid"])}


def quiet_state(server, load, settle):
    """After settle seconds of load, the server's state with the clients
    paused (server_state() and "quiet": whether its threads and fds
    stayed the same for QUIET_S within QUIET_MAX_S); the clients go on
    after."""
    time.sleep(settle)
    load.pause()
    try:
        end = time.monotonic() + QUIET_MAX_S
        last = None
        since = time.monotonic()
        while True:
            state = server_state(server.pid)
            now = time.monotonic()
            key = (state["threads"], state["fds"])
            if key != last:
                last, since = key, now
            elif now - since >= QUIET_S:
                state["quiet"] = True
                return state
            if now >= end:
                state["quiet"] = False
                return state
            time.sleep(0.1)
    finally:
        load.resume()


def start_server(python, limit, stderr):
    """The server, and its port, once it listens."""
    server = subprocess.Popen([python, SERVER, str(limit)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=stderr, start_new_session=True)
    ready, _, _ = select.select([server.stdout], [], [], 30)
    words = server.stdout.readline().split() if ready else []
    if len(words) != 3 or words[0] != b"ready":
        return server, None
    return server, int(words[2])


def stop_server(server):
    """Close its stdin (it stops serving and exits); kill it if it does
    not within 10 s.  Its exit status, or None if killed."""
    if server.stdin:
        try:
            server.stdin.close()
        except OSError:
            pass
    try:
        return server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        return None


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def end_tool(tool):
    """End a usdt.stacks that did not end on its SIGINT, and everything it
    started: SIGTERM first, on which it stops bpftrace and removes its
    temporary files, then, after TOOL_GRACE_S, SIGKILL to its process
    group (it leads a session of its own).  Reaps it."""
    if tool.poll() is None:
        tool.send_signal(signal.SIGTERM)
        try:
            tool.wait(TOOL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(tool.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    tool.wait()


def tail(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-STDERR_TAIL:]
    except OSError:
        return ""


def session(index, server, args, tmp, timeout):
    """One run of usdt.stacks against the server; its record."""
    records = os.path.join(tmp, "records")
    out_path = os.path.join(tmp, "out.json")
    err_path = os.path.join(tmp, "err.txt")
    # The tool's TMPDIR: what it leaves there is seen, and removed.
    tool_tmp = os.path.join(tmp, "tool-tmp")
    for path in (records, out_path, err_path):
        if os.path.exists(path):
            os.unlink(path)
    shutil.rmtree(tool_tmp, ignore_errors=True)
    os.mkdir(tool_tmp)
    result = {"session": index, "ok": False, "attach_s": None,
              "samples": None, "stacks": None, "exit_status": None,
              "error": None}
    start = time.monotonic()
    end = start + timeout
    with open(out_path, "w") as out, open(err_path, "w") as err:
        tool = subprocess.Popen(
            [sys.executable, TOOL, "--json", "--python", args.python,
             "--probe", "profile:hz:%d" % args.hz, "--save", records,
             "-p", str(server.pid)],
            stdout=out, stderr=err, start_new_session=True,
            env=dict(os.environ, TMPDIR=tool_tmp))
    try:
        # Attached once the first record is there.
        while time.monotonic() < end and tool.poll() is None:
            if os.path.exists(records) and os.path.getsize(records):
                result["attach_s"] = time.monotonic() - start
                break
            time.sleep(0.02)
        if result["attach_s"] is None:
            if tool.poll() is not None:
                result["exit_status"] = tool.returncode
                result["error"] = "ended before its first record"
            else:
                result["error"] = "no record within %.0f s" % timeout
            return result
        time.sleep(max(0.0, min(args.seconds, end - time.monotonic())))
        tool.send_signal(signal.SIGINT)
        try:
            tool.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            result["error"] = ("did not end within %.0f s of its start"
                               % timeout)
            return result
        result["exit_status"] = tool.returncode
        if group_alive(tool.pid):
            result["error"] = "left a process of its own running"
            return result
        left = sorted(os.listdir(tool_tmp))
        if left:
            result["error"] = "left in its TMPDIR: %s" % " ".join(left)
            return result
        if tool.returncode != 0:
            result["error"] = "exit status %d" % tool.returncode
            return result
        try:
            with open(out_path) as f:
                rows = json.load(f)
        except ValueError as error:
            result["error"] = "its output is not JSON: %s" % error
            return result
        result["samples"] = sum(row["count"] for row in rows)
        result["stacks"] = len(rows)
        named = any(frame.get("name") in SERVER_FUNCTIONS
                    for row in rows for frame in row["frames"])
        if not result["samples"]:
            result["error"] = "no samples"
        elif not named:
            result["error"] = "no stack names the server's work()"
        else:
            result["ok"] = True
        return result
    finally:
        if tool.poll() is None or group_alive(tool.pid):
            end_tool(tool)
        result["seconds"] = time.monotonic() - start
        stderr = tail(err_path)
        if stderr:
            result["stderr"] = stderr


def after_sessions_s(args):
    """The longest the run takes after its last session started to end:
    the session's tool ending on SIGTERM, the reading after (the settle
    time, the clients' pause, the wait for quiet), the clients' stop, and
    the server's."""
    return (TOOL_GRACE_S + args.settle + 2 * (args.request_timeout + 5)
            + QUIET_MAX_S + 10)


def run(args, tmp, report):
    """Start the server and the load, run the sessions, and fill
    *report*; the list of failures."""
    failures = []
    server_err = os.path.join(tmp, "server-stderr.txt")
    server = load = None
    try:
        with open(server_err, "w") as err:
            server, port = start_server(args.python,
                                        int(args.max_seconds) + 60, err)
        if port is None:
            failures.append("the server did not start (exit status %s): %s"
                            % (server.poll(),
                               tail(server_err).strip() or "no message"))
            return failures
        log("server %d on %s:%d, %d clients" % (server.pid, HOST, port,
                                                args.clients))
        load = Load(port, args.clients, args.request_timeout)
        before = reading(server, load, args.settle, "before", report)
        if before is not None:
            load.phase = "sessions"
            try:
                run_sessions(server, args, tmp, report, failures)
            finally:
                load.phase = "outside"
            after = reading(server, load, args.settle, "after", report)
            if after is not None:
                compare(before, after, args, failures)
        if server.poll() is not None:
            failures.append("the server ended (status %s) after %d "
                            "session(s)" % (server.returncode,
                                            len(report["sessions"])))
        load.stop()
        load_report(load, report, failures)
        status = stop_server(server)
        report["server_exit_status"] = status
        if status != 0:
            failures.append("the server's exit status: %s"
                            % ("killed after 10 s" if status is None
                               else status))
        server = None
    finally:
        if load is not None and not load.stopped:
            load.stop()
        if server is not None:
            stop_server(server)
        stderr = tail(server_err)
        if stderr:
            report["server_stderr"] = stderr
            failures.append("the server wrote on stderr:\n" + stderr)
    return failures


def reading(server, load, settle, when, report):
    """quiet_state(), kept in report["server_" + when]; None if the
    server has ended."""
    if server.poll() is not None:
        return None
    try:
        state = quiet_state(server, load, settle)
    except ProcessLookupError:
        return None
    report["server_" + when] = state
    log("%s: RSS %d KiB, %d fds, %d threads"
        % (when, state["rss_kib"], state["fds"], state["threads"]))
    return state


def run_sessions(server, args, tmp, report, failures):
    """The sessions, one after another, while the server runs and the
    time lasts."""
    sessions_end = T_START + args.max_seconds - after_sessions_s(args)
    sessions = report["sessions"]
    for index in range(1, args.sessions + 1):
        if server.poll() is not None:
            break
        remaining = sessions_end - time.monotonic()
        if remaining < args.seconds:
            failures.append("stopped early: --max-seconds %g ran out after "
                            "%d of %d sessions" % (args.max_seconds,
                                                   index - 1, args.sessions))
            break
        result = session(index, server, args, tmp,
                         min(args.session_timeout, remaining))
        try:
            result["server_rss_kib"] = server_state(server.pid)["rss_kib"]
        except ProcessLookupError:
            pass
        sessions.append(result)
        log("session %d/%d: %s, attached in %s, %s samples, %s stacks, "
            "exit status %s, %.1f s"
            % (index, args.sessions,
               "ok" if result["ok"] else "FAILED: " + result["error"],
               "-" if result["attach_s"] is None
               else "%.2f s" % result["attach_s"],
               result["samples"], result["stacks"], result["exit_status"],
               result["seconds"]))
        if not result["ok"] and "stderr" in result:
            sys.stderr.write(result["stderr"].rstrip("\n") + "\n")
    failed = [r["session"] for r in sessions if not r["ok"]]
    if failed:
        failures.append("%d session(s) failed: %s"
                        % (len(failed), ", ".join(map(str, failed))))


def compare(before, after, args, failures):
    for state, when in ((before, "before"), (after, "after")):
        if not state["quiet"]:
            failures.append("the server's threads and fds did not settle "
                            "%s" % when)
    for key in ("fds", "threads"):
        if after[key] != before[key]:
            failures.append("the server's %s: %d before, %d after"
                            % (key, before[key], after[key]))
    grown = after["rss_kib"] - before["rss_kib"]
    if grown > args.rss_tolerance_kib:
        failures.append("the server's RSS grew by %d KiB (more than %d)"
                        % (grown, args.rss_tolerance_kib))
    if after["tracer_pid"]:
        failures.append("the server is traced by process %d"
                        % after["tracer_pid"])


def load_report(load, report, failures):
    counts = load.counts
    report["requests"] = {"sent": counts["sent"],
                          "answered": counts["answered"],
                          "failed": counts["failed"],
                          "failures": dict(load.failures),
                          "slowest_s": load.slowest}
    if counts["failed"] or counts["sent"] != counts["answered"]:
        failures.append("requests: %d sent, %d answered, %d failed (%s)"
                        % (counts["sent"], counts["answered"],
                           counts["failed"],
                           ", ".join("%s: %d" % kv for kv in
                                     sorted(load.failures.items()))
                           or "none failed: some unanswered"))


def summary(args, report):
    """The human report's lines."""
    sessions = report["sessions"]
    lines = ["soak: usdt.stacks --probe profile:hz:%d -p SERVER, %g s per "
             "session, %d clients, under %s"
             % (args.hz, args.seconds, args.clients, args.python),
             "sessions: %d of %d run, %d ok"
             % (len(sessions), args.sessions,
                sum(r["ok"] for r in sessions))]
    samples = [r["samples"] for r in sessions if r["samples"] is not None]
    if samples:
        lines.append("samples per session: min %d, median %g, max %d"
                     % (min(samples), statistics.median(samples),
                        max(samples)))
    attach = [r["attach_s"] for r in sessions if r["attach_s"] is not None]
    if attach:
        lines.append("attach time: median %.2f s, max %.2f s"
                     % (statistics.median(attach), max(attach)))
    requests = report.get("requests")
    if requests:
        lines.append("requests: %d sent, %d answered, %d failed"
                     % (requests["sent"], requests["answered"],
                        requests["failed"]))
        slowest = requests["slowest_s"]
        if slowest:
            lines.append("slowest answer: %s" % ", ".join(
                "%.3f s %s" % (slowest[phase], phase.replace(
                    "sessions", "during the sessions"))
                for phase in ("sessions", "outside") if phase in slowest))
    before = report.get("server_before")
    after = report.get("server_after")
    if before and after:
        lines.append("server RSS: %d KiB before, %d KiB after (%+d KiB; "
                     "tolerance %d KiB)"
                     % (before["rss_kib"], after["rss_kib"],
                        after["rss_kib"] - before["rss_kib"],
                        args.rss_tolerance_kib))
        lines.append("server fds: %d before, %d after"
                     % (before["fds"], after["fds"]))
        lines.append("server threads: %d before, %d after"
                     % (before["threads"], after["threads"]))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python", nargs="?", default=DEFAULT_PYTHON,
                        help="the interpreter the server runs under "
                        "(default %(default)s)")
    parser.add_argument("--sessions", type=int, default=100,
                        help="usdt.stacks runs (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=2,
                        help="sampling time per session, from its attach "
                        "(default %(default)s)")
    parser.add_argument("--hz", type=int, default=99,
                        help="the profile probe's rate (default "
                        "%(default)s)")
    parser.add_argument("--session-timeout", type=float, default=60,
                        help="a session's longest time, start to end "
                        "(default %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=900,
                        help="the whole run's longest time; the sessions "
                        "stop early (and fail) so the run ends within it "
                        "(default %(default)s)")
    parser.add_argument("--clients", type=int, default=4,
                        help="client threads (default %(default)s)")
    parser.add_argument("--request-timeout", type=float, default=10,
                        help="a request's longest time (default "
                        "%(default)s)")
    parser.add_argument("--settle", type=float, default=10,
                        help="seconds of load before each reading of the "
                        "server's state (default %(default)s)")
    parser.add_argument("--rss-tolerance-kib", type=int, default=2048,
                        help="how much the server's RSS may grow "
                        "(default %(default)s)")
    parser.add_argument("--out-json", metavar="FILE")
    args = parser.parse_args()
    args.python = os.path.abspath(args.python)
    if not os.access(args.python, os.X_OK):
        parser.error("%s is not executable" % args.python)
    if (args.sessions < 0 or args.rss_tolerance_kib < 0
            or args.clients < 1 or args.seconds <= 0):
        parser.error("--sessions and --rss-tolerance-kib must be 0 or "
                     "more, --clients 1 or more, --seconds more than 0")
    # The server's start (30 s at most), the reading before, one
    # session, and what comes after the sessions.
    least = (30 + args.settle + QUIET_MAX_S + args.request_timeout + 5
             + args.seconds + after_sessions_s(args))
    if args.max_seconds < least:
        parser.error("--max-seconds must be at least %g with this --settle, "
                     "--seconds and --request-timeout" % least)
    if os.geteuid() != 0:
        sys.exit("run as root (bpftrace)")
    signal.signal(signal.SIGTERM, interrupt)
    report = {"python": args.python, "hz": args.hz, "seconds": args.seconds,
              "clients": args.clients,
              "rss_tolerance_kib": args.rss_tolerance_kib, "sessions": []}
    try:
        with tempfile.TemporaryDirectory(prefix="soak-profile-") as tmp:
            failures = run(args, tmp, report)
    except KeyboardInterrupt:
        sys.stderr.write("soak: interrupted after %d session(s); everything "
                         "it started has ended\n" % len(report["sessions"]))
        return 130
    report["failures"] = failures
    report["ok"] = not failures
    report["elapsed_s"] = time.monotonic() - T_START
    for line in summary(args, report):
        print(line)
    for failure in failures:
        print("FAIL: " + failure)
    print("result: %s" % ("ok" if not failures else "FAILED"))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

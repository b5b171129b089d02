"""Runs a parity corpus in the main thread and in two more threads.

Each thread first prints "ROLE <name> <native thread id>", so that counts
keyed by thread id can be matched between two runs.  Its frames are in
this file, not in the corpus's, so the parity tests do not count them.
"""

import sys
import threading


def role(name):
    sys.stdout.write("ROLE %s %d\n" % (name, threading.get_native_id()))
    sys.stdout.flush()


def worker(name, corpus, rounds):
    role(name)
    corpus(rounds)


def run_in_three_threads(corpus, rounds):
    role("main")
    threads = [threading.Thread(target=worker,
                                args=("thread-%d" % n, corpus, rounds))
               for n in (1, 2)]
    for t in threads:
        t.start()
    corpus(rounds)
    for t in threads:
        t.join()

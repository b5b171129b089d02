"""Requests for examples/http_routes.py, from 4 threads at once.

    python examples/http_load.py PORT [ROUNDS]      (default 100)

Each round GETs / and /users/<id> (ids 1 to 4 in turn; there is no user
4), and every tenth round /slow and /nope (no such route).  Prints how
many requests of each route got each status.
"""

import collections
import concurrent.futures
import sys
import urllib.error
import urllib.request

port = int(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 100
requests = []                           # (route, path)
for i in range(rounds):
    requests += [("/", "/"), ("/users/<id>", "/users/%d" % (i % 4 + 1))]
    if i % 10 == 0:
        requests += [("/slow", "/slow"), ("-", "/nope")]


def get(path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s"
                                    % (port, path)) as response:
            return response.status
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


with concurrent.futures.ThreadPoolExecutor(4) as pool:
    statuses = pool.map(get, [path for _, path in requests])
    counts = collections.Counter(zip((route for route, _ in requests),
                                     statuses))
for (route, status), n in sorted(counts.items()):
    print("%s %d: %d" % (route, status, n))

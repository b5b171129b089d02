import json
import time

def handle(n):
    time.sleep(0.01)                  # the slow part
    items = sorted(range(n, 0, -1))
    return json.dumps({"n": n, "items": items})

for n in range(20):
    handle(n)

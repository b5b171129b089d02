import json
import threading
import time

def handle(request):
    try:
        return json.loads(request)
    except ValueError:                # one request in two is bad
        return None

time.sleep(3)                         # time to attach the tracer
deadline = time.monotonic() + 60
while time.monotonic() < deadline:    # about ten requests a second,
    for request in ['{"id": 1}', "{"]:
        worker = threading.Thread(target=handle, args=(request,))
        worker.start()                # each in a thread of its own
        worker.join()
    time.sleep(0.2)

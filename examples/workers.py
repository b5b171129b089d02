import threading
import time

def spin(n):                          # CPU-bound: holds the GIL
    while n:
        n -= 1

def nap():                            # sleeps without the GIL
    time.sleep(0.2)

threads = [threading.Thread(target=spin, args=(2_000_000,)),
           threading.Thread(target=spin, args=(2_000_000,)),
           threading.Thread(target=nap)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(*(thread.native_id for thread in threads))

import gc, time

class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

class Node:
    def __init__(self):
        self.next = self          # a reference cycle

time.sleep(3)                     # time to attach the tracer
points = [Point(i, i) for i in range(1000)]
del points[100:]                  # 100 points stay alive
nodes = [Node() for _ in range(50)]
del nodes
gc.collect()                      # the 50 nodes are collected
time.sleep(60)

"""Allocates 64 buffers of 1 MiB, each dropped at once, and keeps a copy
of every fourth: 80 MiB allocated in large blocks, 16 MiB of it kept."""

kept = {}
for i in range(64):
    temporary = bytearray(1 << 20)
    if i % 4 == 0:
        kept[i] = bytes(temporary)
print(len(kept), "MiB kept")

import asyncio
import time

async def poll(n):
    for _ in range(n):
        await asyncio.sleep(0.001)

async def blocker():
    time.sleep(0.05)                  # blocks the event loop: a bug
    await asyncio.sleep(0)

async def main():
    await asyncio.gather(poll(10), poll(20), blocker())

asyncio.run(main())

"""Test 5b: find the overall cap: 100 held connections from each of 127.0.0.1..127.0.0.6 (600),
then GET /readyz from 127.0.0.9."""
import os
import asyncio, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
async def main():
    conns = []
    for a in range(1, 7):
        for _ in range(100):
            conns.append(await asyncio.open_connection(HOST, PORT, local_addr=(f"127.0.0.{a}", 0)))
    await asyncio.sleep(0.5)
    async def rd(r):
        try: return await asyncio.wait_for(r.read(100), 0.5)
        except asyncio.TimeoutError: return None
        except ConnectionResetError: return b"RST"
    reads = await asyncio.gather(*[rd(r) for r, _ in conns])
    held = sum(1 for d in reads if d is None)
    print(f"600 connections from 6 addresses: held {held}, turned away {600-held}")
    t = time.perf_counter()
    s, h, b = await areq("GET", "/readyz", source="127.0.0.9")
    print(f"127.0.0.9 GET /readyz: {s} in {(time.perf_counter()-t)*1000:.1f} ms {b[:100]}")
    s, h, b = await areq("GET", "/metrics", source="127.0.0.9") if s == 200 else (None, None, b"")
    for _, w in conns: w.close()
    await asyncio.sleep(0.5)
    s, h, b = await areq("GET", "/metrics", source="127.0.0.9")
    for l in b.decode().splitlines():
        if l.startswith("leasegate_connections_closed_total") or l.startswith("leasegate_open_connections"): print("  ", l)
asyncio.run(main())

"""Test 4: 200 silent connections (connect, send nothing) and 200 idle kept-alive connections
(one GET /livez, then nothing). Observe for up to MAXT s when the server closes each."""
import os
import asyncio, sys, time, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
MAXT = float(sys.argv[2]) if len(sys.argv) > 2 else 100

async def conn(kind):
    r, w = await asyncio.open_connection(HOST, PORT)
    t0 = time.monotonic(); first = None
    if kind == "idle":
        w.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); await w.drain()
        s, h, b = await aread_response(r)
        first = s
        t0 = time.monotonic()  # idle from the end of the answer
    try:
        d = await asyncio.wait_for(r.read(4096), MAXT)
        t = time.monotonic() - t0
        res = (t, d[:40])
    except asyncio.TimeoutError:
        res = (None, b"")
    except ConnectionResetError:
        res = (time.monotonic() - t0, b"(RST)")
    w.close()
    return kind, first, res

def summary(kind, rs):
    cl = sorted(x[2][0] for x in rs if x[2][0] is not None)
    what = {}
    for x in rs:
        if x[2][0] is not None:
            k = x[2][1].decode(errors="replace") or "(EOF)"; what[k] = what.get(k, 0) + 1
    print(f"{kind}: {len(rs)} connections, first answers {set(x[1] for x in rs)}, closed by server within {MAXT}s: {len(cl)}")
    if cl: print(f"   close time: min {cl[0]:.2f}s median {statistics.median(cl):.2f}s max {cl[-1]:.2f}s; read: {what}")

async def main():
    rs = await asyncio.gather(*[conn("silent") for _ in range(N)], *[conn("idle") for _ in range(N)])
    summary("silent", [x for x in rs if x[0] == "silent"])
    summary("idle kept-alive (time from end of the answer)", [x for x in rs if x[0] == "idle"])
asyncio.run(main())

"""Test 2: slowloris. usage: t2_slowloris.py [N=2000] [DURATION=45] [INTERVAL=5]
Each connection sends a request line, then one header line every INTERVAL s, for DURATION s.
Records when (after connect) the server closed it and what it sent. Meanwhile probes GET /readyz."""
import os
import asyncio, sys, time, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
DUR = float(sys.argv[2]) if len(sys.argv) > 2 else 45
IV = float(sys.argv[3]) if len(sys.argv) > 3 else 5
results = []  # (connected, closed_at_rel or None, bytes_read_first_80, headers_sent)
stop = False

async def slow(i):
    try:
        r, w = await asyncio.open_connection(HOST, PORT)
    except Exception as e:
        results.append(("connect_fail:" + type(e).__name__, None, b"", 0)); return
    t0 = time.monotonic()
    w.write(b"GET /readyz HTTP/1.1\r\n"); await w.drain()
    got = b""; sent = 0
    async def reader():
        nonlocal got
        while True:
            try:
                d = await r.read(4096)
            except ConnectionResetError:
                got += b"(RST)"; return
            if not d: return
            got += d
    rt = asyncio.create_task(reader())
    closed = None
    while time.monotonic() - t0 < DUR:
        done, _ = await asyncio.wait([rt], timeout=IV)
        if done:
            closed = time.monotonic() - t0; break
        try:
            w.write(f"X-Slow-{sent}: {sent}\r\n".encode()); await w.drain(); sent += 1
        except Exception:
            # write failed: connection reset by server
            try:
                await asyncio.wait_for(rt, 1)
            except Exception:
                pass
            closed = time.monotonic() - t0; break
    if closed is None:
        rt.cancel()
    w.close()
    results.append(("ok", closed, got[:80], sent))

async def probe(lat, statuses):
    while not stop:
        t = time.perf_counter()
        try:
            s, h, b = await asyncio.wait_for(areq("GET", "/readyz"), 10)
            statuses[s] = statuses.get(s, 0) + 1
        except Exception as e:
            statuses["err:" + type(e).__name__] = statuses.get("err:" + type(e).__name__, 0) + 1
        lat.append((time.perf_counter() - t) * 1000)
        await asyncio.sleep(0.2)

async def main():
    global stop
    lat, st = [], {}
    p = asyncio.create_task(probe(lat, st))
    tasks = []
    for i in range(N):
        tasks.append(asyncio.create_task(slow(i)))
        if i % 100 == 99: await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    stop = True; await p
    ok = [x for x in results if x[0] == "ok"]
    closed = sorted(x[1] for x in ok if x[1] is not None)
    print(f"connections attempted {N}, connected {len(ok)}, connect failures {N-len(ok)}")
    print(f"closed by server within {DUR}s: {len(closed)}; still open at end: {len(ok)-len(closed)}")
    if closed:
        print(f"close time after connect: min {closed[0]:.2f}s median {statistics.median(closed):.2f}s max {closed[-1]:.2f}s")
    what = {}
    for x in ok:
        if x[1] is not None:
            k = x[2].split(b"\r\n")[0].decode(errors="replace") or "(nothing, EOF)"
            what[k] = what.get(k, 0) + 1
    print("what closed connections read:", what)
    hs = {}
    for x in ok: hs[x[3]] = hs.get(x[3], 0) + 1
    print("header lines sent before close/end:", dict(sorted(hs.items())))
    print(f"readyz probes during attack: {len(lat)} statuses {st} p50 {pctl(lat,50):.1f} ms p99 {pctl(lat,99):.1f} ms max {max(lat):.1f} ms")

asyncio.run(main())

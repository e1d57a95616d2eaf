"""Test 5: connection caps. Service started under `ulimit -n 512`.
One client opens N (620) connections from 127.0.0.1 and holds them; then a client bound to
127.0.0.2 does GET /readyz (5 times)."""
import os
import asyncio, sys, time, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
N = int(sys.argv[1]) if len(sys.argv) > 1 else 620

async def opener(i, conns, fails):
    try:
        r, w = await asyncio.open_connection(HOST, PORT, local_addr=("127.0.0.1", 0))
        conns.append((r, w))
    except Exception as e:
        fails[type(e).__name__] = fails.get(type(e).__name__, 0) + 1

async def first_read(r, t):
    try:
        return await asyncio.wait_for(r.read(4096), t)
    except asyncio.TimeoutError:
        return None
    except ConnectionResetError:
        return b"(RST)"

async def main():
    conns, fails = [], {}
    t0 = time.monotonic()
    for i in range(N):
        await opener(i, conns, fails)
    print(f"opened {len(conns)} TCP connections from 127.0.0.1 in {time.monotonic()-t0:.2f}s; connect failures {fails}")
    await asyncio.sleep(0.5)
    reads = await asyncio.gather(*[first_read(r, 0.5) for r, _ in conns])
    turned = [(c, d) for c, d in zip(conns, reads) if d is not None]
    quiet = [c for c, d in zip(conns, reads) if d is None]
    kinds = {}
    for _, d in turned:
        k = d.split(b"\r\n")[0].decode(errors="replace") or "(EOF)"
        kinds[k] = kinds.get(k, 0) + 1
    print(f"turned away before sending anything: {len(turned)}; what they read (status line): {kinds}")
    if turned and turned[0][1]:
        print("   example:", turned[0][1].decode(errors="replace").replace("\r\n", " | ")[:400])
    # the quiet ones: send a real request, keep-alive, to show they are held and served
    async def use(r, w):
        try:
            w.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); await w.drain()
            s, h, b = await asyncio.wait_for(aread_response(r), 5); return s
        except Exception as e:
            return type(e).__name__
    st = await asyncio.gather(*[use(r, w) for r, w in quiet])
    c = {}
    for s in st: c[s] = c.get(s, 0) + 1
    print(f"held (not turned away): {len(quiet)}; a GET /livez on each: {c}")
    # the other client
    lat, sts = [], {}
    for _ in range(5):
        t = time.perf_counter()
        try:
            s, h, b = await asyncio.wait_for(areq("GET", "/readyz", source="127.0.0.2"), 5)
        except Exception as e:
            s = type(e).__name__
        lat.append((time.perf_counter() - t) * 1000); sts[s] = sts.get(s, 0) + 1
    print(f"127.0.0.2 GET /readyz x5 while the 620 are held: {sts}; latency ms {[round(x,1) for x in lat]}")
    # one more from 127.0.0.1 while held
    try:
        s, h, b = await asyncio.wait_for(areq("GET", "/readyz", source="127.0.0.1"), 5)
        print(f"one more GET /readyz from 127.0.0.1 while held: {s} Retry-After={h.get('retry-after')} {b[:120]}")
    except Exception as e:
        print("one more from 127.0.0.1:", type(e).__name__)
    s, h, b = await areq("GET", "/metrics", source="127.0.0.2")
    for l in b.decode().splitlines():
        if l.startswith("leasegate_open_connections") or l.startswith("leasegate_connections_closed_total"):
            print("  ", l)
    for _, w in conns: w.close()
asyncio.run(main())

"""Test 1b: 5,000 invented methods (16-64 A-Z) on known paths, 20 keep-alive connections; prints /metrics size and the duration series."""
import os
import asyncio, random, string, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
paths = ["/readyz", "/livez", "/metrics", "/api/v1/lease", "/api/v1/jobs/x", "/api/v1/admin/pools", "/admin/login", "/api/v1/leases/abc/start"]
async def w(n, stats):
    r, wr = await asyncio.open_connection(HOST, PORT)
    for _ in range(n):
        m = "".join(random.choice(string.ascii_uppercase) for _ in range(random.randint(16, 64)))
        wr.write(f"{m} {random.choice(paths)}?q={random.random()} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()); await wr.drain()
        s, h, b = await aread_response(r); stats[s] = stats.get(s, 0) + 1
    wr.close()
async def main():
    st = {}
    await asyncio.gather(*[w(250, st) for _ in range(20)])
    print("5000 invented methods on known paths:", st)
asyncio.run(main())
s, h, b = req("GET", "/metrics"); print("metrics size", len(b))
for l in b.decode().splitlines():
    if l.startswith("leasegate_http_request_duration_seconds_count"): print(" ", l)

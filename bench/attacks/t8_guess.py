"""Test 8: credential guessing.
usage: t8_guess.py api|login SECONDS
Attacker (this process, source 127.0.0.1, 8 keep-alive connections) sends wrong credentials as
fast as it can; a light legitimate client (child process, source 127.0.0.2) sends the right admin
token every 50 ms (GET /api/v1/admin/pools, or POST /admin/login for 'login')."""
import asyncio, os, random, subprocess, sys, time, json, statistics
from urllib.parse import urlencode
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
MODE = sys.argv[1]; SECS = float(sys.argv[2])

def request_bytes(token):
    if MODE == "api":
        return f"GET /api/v1/admin/pools HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    body = urlencode({"token": token}).encode()
    return (f"POST /admin/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body

async def attacker(deadline, st, ra):
    r = w = None
    while time.monotonic() < deadline:
        try:
            if w is None:
                r, w = await asyncio.open_connection("127.0.0.1", PORT, local_addr=("127.0.0.1", 0))
            w.write(request_bytes(os.urandom(32).hex())); await w.drain()
            s, h, b = await aread_response(r)
            st[s] = st.get(s, 0) + 1
            if "retry-after" in h: ra[h["retry-after"]] = ra.get(h["retry-after"], 0) + 1
            if h.get("connection", "").lower() == "close": w.close(); w = None
        except Exception as e:
            st["err:" + type(e).__name__] = st.get("err:" + type(e).__name__, 0) + 1
            if w: w.close()
            w = None

def legit():
    deadline = time.monotonic() + SECS
    st, lat = {}, []
    while time.monotonic() < deadline:
        t = time.perf_counter()
        if MODE == "api":
            s, h, b = req("GET", "/api/v1/admin/pools", token=ADMIN, source="127.0.0.2")
        else:
            s, h, b = req("POST", "/admin/login", raw=urlencode({"token": ADMIN}).encode(),
                          headers={"Content-Type": "application/x-www-form-urlencoded"}, source="127.0.0.2")
        lat.append((time.perf_counter() - t) * 1000); st[s] = st.get(s, 0) + 1
        time.sleep(0.05)
    print(json.dumps({"statuses": st, "n": len(lat), "p50_ms": round(pctl(lat, 50), 2),
                      "p99_ms": round(pctl(lat, 99), 2), "max_ms": round(max(lat), 2)}))

if len(sys.argv) > 3 and sys.argv[3] == "--legit":
    legit(); sys.exit()

async def main():
    child = subprocess.Popen([sys.executable, __file__, MODE, str(SECS), "--legit"], stdout=subprocess.PIPE)
    st, ra = {}, {}
    t0 = time.monotonic()
    await asyncio.gather(*[attacker(t0 + SECS, st, ra) for _ in range(8)])
    dt = time.monotonic() - t0
    out = child.communicate()[0].decode()
    n = sum(v for k, v in st.items() if isinstance(k, int))
    print(f"[{MODE}] attacker: {n} requests in {dt:.1f}s ({n/dt:.0f}/s); statuses {st}; Retry-After values {ra}")
    print(f"[{MODE}] legitimate client from 127.0.0.2: {out.strip()}")
    # also: the attacker presenting the RIGHT token while throttled
    s, h, b = req("GET", "/api/v1/admin/pools", token=ADMIN, source="127.0.0.1")
    print(f"[{MODE}] right admin token from the throttled address right after: {s} Retry-After={h.get('retry-after')}")
    s, h, b = req("GET", "/readyz", source="127.0.0.1")
    print(f"[{MODE}] GET /readyz (no credential) from the throttled address: {s}")
asyncio.run(main())

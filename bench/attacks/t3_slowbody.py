"""Test 3: slow body. POST /api/v1/runners/heartbeat, Content-Length 1000, 1 byte every INTERVAL s.
usage: t3_slowbody.py [INTERVAL=5] [MAXTIME=60]"""
import os
import asyncio, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
IV = float(sys.argv[1]) if len(sys.argv) > 1 else 5
MAXT = float(sys.argv[2]) if len(sys.argv) > 2 else 60

async def one(label, first_bytes=b"", iv=IV):
    r, w = await asyncio.open_connection(HOST, PORT)
    t0 = time.monotonic()
    w.write(b"POST /api/v1/runners/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + first_bytes)
    await w.drain()
    got = b""; sent = len(first_bytes)
    rd = asyncio.create_task(r.read(65536))
    while time.monotonic() - t0 < MAXT:
        done, _ = await asyncio.wait([rd], timeout=iv)
        if done:
            try: got = rd.result()
            except Exception as e: got = f"({type(e).__name__})".encode()
            break
        try:
            w.write(b" "); await w.drain(); sent += 1
        except Exception as e:
            got = f"(write failed {type(e).__name__})".encode(); break
    t = time.monotonic() - t0
    # read rest until EOF to see whether the server closed
    eof = None
    try:
        rest = await asyncio.wait_for(r.read(65536), 3)
        got += rest
        eof = (rest == b"")
    except Exception as e:
        eof = type(e).__name__
    w.close()
    head = got.split(b"\r\n\r\n")[0].decode(errors="replace")
    body = got.split(b"\r\n\r\n", 1)[1][:300].decode(errors="replace") if b"\r\n\r\n" in got else ""
    print(f"[{label}] answered after {t:.2f}s, body bytes sent {sent}; closed after answer: {eof}")
    print("   " + head.replace("\r\n", "\n   "))
    print("   body:", body)

async def main():
    await one(f"1 byte every {IV}s")
    await one("nothing after headers (pause)", iv=1e9)
asyncio.run(main())

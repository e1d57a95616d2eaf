"""Extra connection probes:
 a) slowloris on the SECOND request of a kept-alive connection;
 b) a client that pipelines GET /openapi.json requests and never reads (write_stalled);
 c) a chunked body trickled 1 byte every 5 s;
 d) a long poll (lease wait_s=30) is not cut by the timeouts: answered 204 at ~30 s."""
import os
import asyncio, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *

async def a():
    r, w = await asyncio.open_connection(HOST, PORT)
    w.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); await w.drain()
    await aread_response(r)
    await asyncio.sleep(2)
    t0 = time.monotonic()
    w.write(b"GET /livez HTTP/1.1\r\n"); await w.drain()
    n = 0
    while time.monotonic() - t0 < 40:
        try:
            d = await asyncio.wait_for(r.read(100), 5)
            print(f"a) 2nd request head trickled: server closed after {time.monotonic()-t0:.2f}s from its first byte, read {d[:30]!r}"); break
        except asyncio.TimeoutError:
            w.write(f"X-{n}: y\r\n".encode()); await w.drain(); n += 1
        except ConnectionResetError:
            print(f"a) RST after {time.monotonic()-t0:.2f}s"); break
    else:
        print("a) NOT CLOSED within 40s")
    w.close()

async def b():
    r, w = await asyncio.open_connection(HOST, PORT)
    import socket
    w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    t0 = time.monotonic(); sent = 0
    try:
        for _ in range(3000):
            w.write(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"); sent += 1
        await asyncio.wait_for(w.drain(), 5)
    except Exception as e:
        pass
    print(f"b) pipelined {sent} GET /openapi.json without reading; waiting for the server to give up...")
    # wait without reading, then probe whether the socket is closed
    closed_at = None
    for i in range(120):
        await asyncio.sleep(1)
        s = w.get_extra_info("socket")
        try:
            import select
            # peek: check for RST/FIN via a zero-timeout poll on the raw socket for error
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        except Exception:
            err = None
        if r.at_eof() or err:
            closed_at = time.monotonic() - t0; break
        # check TCP state from /proc (FIN received => CLOSE_WAIT)
        lport = s.getsockname()[1]
        st = open("/proc/net/tcp").read()
        key = f":{lport:04X} "
        for line in st.splitlines()[1:]:
            f = line.split()
            if f[1].endswith(f":{lport:04X}") and f[3] in ("08", "07"):  # CLOSE_WAIT / CLOSE
                closed_at = time.monotonic() - t0; break
        if closed_at: break
    print(f"b) server closed the non-reading connection after {closed_at:.1f}s" if closed_at else "b) NOT CLOSED within 120s")
    w.close()

async def c():
    r, w = await asyncio.open_connection(HOST, PORT)
    t0 = time.monotonic()
    w.write(b"POST /api/v1/runners/heartbeat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"); await w.drain()
    while time.monotonic() - t0 < 40:
        try:
            d = await asyncio.wait_for(r.read(400), 5)
            first = d.split(b"\r\n")[0]; print(f"c) chunked trickle answered after {time.monotonic()-t0:.2f}s: {first!r}"); break
        except asyncio.TimeoutError:
            w.write(b"1\r\n \r\n"); await w.drain()
    else:
        print("c) NOT ANSWERED within 40s")
    w.close()

async def d():
    put_pool("poll")
    rn = register("poller-" + uuid.uuid4().hex[:4], pool="poll")
    t0 = time.monotonic()
    s, h, b = await areq("POST", "/api/v1/lease", json.dumps({"attestation": rn.attest(), "wait_s": 30}).encode())
    print(f"d) long poll wait_s=30 answered {s} after {time.monotonic()-t0:.2f}s")

async def main():
    await asyncio.gather(a(), b(), c(), d())
asyncio.run(main())

"""Test 1: metrics cardinality. usage: t1_metrics.py PID"""
import os
import asyncio, random, string, sys, time, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *

PID = int(sys.argv[1])

def rand_method(lo=16, hi=64):
    return "".join(random.choice(string.ascii_uppercase) for _ in range(random.randint(lo, hi)))

def rand_path():
    return "/" + "/".join("".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(random.randint(4, 12))) for _ in range(random.randint(1, 4)))

def scrape_stats():
    times = []; size = None
    for _ in range(10):
        t = time.perf_counter(); s, h, b = req("GET", "/metrics"); times.append((time.perf_counter() - t) * 1000)
        size = len(b); assert s == 200, s
    return size, statistics.median(times)

async def worker(n, mk_method, stats):
    r = w = None
    for _ in range(n):
        m = mk_method(); p = rand_path()
        for attempt in range(3):
            try:
                if w is None:
                    r, w = await asyncio.open_connection(HOST, PORT)
                w.write(f"{m} {p} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
                await w.drain()
                st, hd, b = await aread_response(r)
                stats[st] = stats.get(st, 0) + 1
                if hd.get("connection", "").lower() == "close":
                    w.close(); w = None
                break
            except Exception as e:
                stats["err:" + type(e).__name__] = stats.get("err:" + type(e).__name__, 0) + 1
                if w: w.close()
                w = None
    if w: w.close()

async def flood(total, conc, mk_method):
    stats = {}
    t = time.perf_counter()
    await asyncio.gather(*[worker(total // conc, mk_method, stats) for _ in range(conc)])
    return stats, time.perf_counter() - t

def main():
    s0, t0 = scrape_stats(); r0 = rss_kb(PID)
    print(f"before: metrics {s0} B, scrape median {t0:.2f} ms, RSS {r0} kB")
    stats, dt = asyncio.run(flood(20000, 40, rand_method))
    print(f"sent 20000 random-method requests (16-64 chars) in {dt:.1f}s: statuses {stats}")
    s1, t1 = scrape_stats(); r1 = rss_kb(PID)
    print(f"after:  metrics {s1} B, scrape median {t1:.2f} ms, RSS {r1} kB")
    stats, dt = asyncio.run(flood(1000, 20, lambda: rand_method(4096, 4096)))
    print(f"sent 1000 4KB-method requests in {dt:.1f}s: statuses {stats}")
    s2, t2 = scrape_stats(); r2 = rss_kb(PID)
    print(f"after 4KB: metrics {s2} B, scrape median {t2:.2f} ms, RSS {r2} kB")
    _, _, b = req("GET", "/metrics")
    lines = [l for l in b.decode().splitlines() if l.startswith("leasegate_http_request_duration_seconds_count")]
    print("duration _count series:", len(lines))
    for l in lines: print("  ", l)

main()

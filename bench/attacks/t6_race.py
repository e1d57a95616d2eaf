"""Test 6: forge cancel racing the runner's lease call on the same job (PostgreSQL).
usage: t6_race.py [WORKERS=6] [PER_WORKER=10]
Each worker has its own pool and runner. Per pair: enqueue, lease, (start), then the two calls
are written on two fresh connections back to back and both answers read."""
import os
import asyncio, sys, time
from collections import Counter
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg import *
W = int(sys.argv[1]) if len(sys.argv) > 1 else 6
PER = int(sys.argv[2]) if len(sys.argv) > 2 else 10

def setup(i):
    name = f"race{i}"
    put_pool(name)
    return name, register(f"racer-{i}-{uuid.uuid4().hex[:6]}", pool=name)

def raw(method, path, body, token):
    b = json.dumps(body).encode() if body is not None else b""
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(b)}\r\n\r\n").encode() + b

async def race(reqs):
    conns = [await asyncio.open_connection(HOST, PORT) for _ in reqs]
    for (r, w), data in zip(conns, reqs):
        w.write(data)
    await asyncio.gather(*[w.drain() for _, w in conns])
    res = await asyncio.gather(*[aread_response(r) for r, _ in conns])
    for _, w in conns: w.close()
    out = []
    for s, h, b in res:
        try: code = json.loads(b).get("code")
        except Exception: code = None
        out.append((s, code, h.get("retry-after")))
    return out

async def ajson(method, path, body, token):
    s, h, b = await areq(method, path, json.dumps(body).encode() if body is not None else b"",
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    return s, (json.loads(b) if b else None)

async def worker(op, pool, runner, pairs, fivexx, problems):
    for _ in range(PER):
        s, j = await ajson("POST", "/api/v1/jobs", {"pool": pool, "payload": {}}, FORGE)
        assert s == 201, (s, j)
        job = j["id"]
        s, L = await ajson("POST", "/api/v1/lease", {"attestation": runner.attest(), "wait_s": 5}, "")
        if s != 200:
            problems.append(("lease", s, L)); continue
        assert L["job"]["id"] == job, (L, job)
        lid, ltok = L["lease_id"], L["lease_token"]
        if op in ("complete", "extend"):
            s, j = await ajson("POST", f"/api/v1/leases/{lid}/start", None, ltok)
            if s != 200: problems.append(("start", s, j)); continue
        body = {"complete": {"outcome": "succeeded", "exit_code": 0}, "extend": {"ttl_s": 600},
                "abandon": {"reason": "race"}, "start": None}[op]
        (cs, cc, cra), (ls, lc, lra) = await race([raw("POST", f"/api/v1/jobs/{job}/cancel", None, FORGE),
                                                   raw("POST", f"/api/v1/leases/{lid}/{op}", body, ltok)])
        pairs[(f"cancel {cs} {cc or ''}".strip(), f"{op} {ls} {lc or ''}".strip())] += 1
        if cs >= 500 or ls >= 500: fivexx.append(((cs, cc, cra), (ls, lc, lra)))
        # final state must be consistent: job cancelled or (complete won and cancel got job_finished)
        s, J = await ajson("GET", f"/api/v1/jobs/{job}", None, FORGE)
        if J["state"] not in ("cancelled", "succeeded"):
            problems.append(("final state", job, J["state"]))
        if J["state"] == "cancelled" and J["lease_id"] is not None:
            problems.append(("cancelled job keeps lease_id", job))

async def main():
    setups = [setup(i) for i in range(W)]
    total5 = 0
    for op in ("start", "complete", "extend", "abandon"):
        pairs, fivexx, problems = Counter(), [], []
        t = time.monotonic()
        await asyncio.gather(*[worker(op, p, r, pairs, fivexx, problems) for p, r in setups])
        n = sum(pairs.values())
        print(f"== {op}: {n} pairs in {time.monotonic()-t:.1f}s, 5xx: {len(fivexx)}, other problems: {len(problems)}")
        for k, v in sorted(pairs.items(), key=lambda kv: -kv[1]):
            print(f"   {v:3d} x  {k[0]:<28} | {k[1]}")
        for f in fivexx[:10]: print("   5xx:", f)
        for p in problems[:10]: print("   problem:", p)
        total5 += len(fivexx)
    print("total 5xx:", total5)
asyncio.run(main())

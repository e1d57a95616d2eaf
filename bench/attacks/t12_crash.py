"""Test 12: crash safety spot check on SQLite.
usage: t12_crash.py [RUNNERS=20] [DURATION=45] [KILLS=3]
Starts the service itself (start.sh, fixed tokens), runs RUNNERS leasing runners
(lease wait_s=5 -> start -> complete succeeded) and a producer that keeps ~30 jobs queued,
kill -9's the service KILLS times (every DURATION/(KILLS+1) s) and restarts it at once,
then stops the load and checks every job through the forge and admin API."""
import asyncio, os, signal, subprocess, sys, time
from collections import Counter, defaultdict
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lg
from lg import *

NR = int(sys.argv[1]) if len(sys.argv) > 1 else 20
DUR = float(sys.argv[2]) if len(sys.argv) > 2 else 45
KILLS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
D = os.path.join(os.environ.get("ATTACK_DIR", "/tmp"), "attack-crash")
ADM, FRG = os.urandom(32).hex(), os.urandom(32).hex()
lg.ADMIN, lg.FORGE = ADM, FRG
os.makedirs(D, exist_ok=True)

def start():
    env = dict(os.environ, FIXED_ADMIN=ADM, FIXED_FORGE=FRG)
    out = subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "start.sh"), "crash", f"sqlite://{D}/lg.db"], env=env,
                         capture_output=True, text=True)
    print("   start:", out.stdout.strip())
    return int(open(f"{D}/pid").read())

stats = Counter()
jobs = {}            # idempotency key -> job id
granted = []         # (t, runner, job, lease)
stop = False

async def call(method, path, body=None, token=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else b""
    h = {"Content-Type": "application/json"}
    if token: h["Authorization"] = "Bearer " + token
    s, hd, b = await asyncio.wait_for(areq(method, path, data, headers=h), timeout)
    return s, (json.loads(b) if b and hd.get("content-type", "").endswith("json") else None)

async def retry(method, path, body=None, token=None, ok=(200, 201, 204, 409, 410)):
    while True:
        try:
            s, j = await call(method, path, body, token)
            if s in ok or s < 500:
                return s, j
            stats[f"{method} {path.split('/')[3]} {s}"] += 1
        except Exception as e:
            stats["conn_err"] += 1
        await asyncio.sleep(0.3)

async def producer():
    n = 0
    while not stop:
        try:
            s, p = await call("GET", "/api/v1/admin/pools/crash", token=ADM)
            q = p["queued_jobs"] if s == 200 else 30
        except Exception:
            q = 30; stats["conn_err"] += 1
        for _ in range(max(0, 30 - q)):
            key = f"crash-{n}"; n += 1
            s, j = await retry("POST", "/api/v1/jobs", {"pool": "crash", "payload": {"n": n}, "idempotency_key": key}, FRG)
            if s in (200, 201): jobs[key] = j["id"]
        await asyncio.sleep(0.2)

async def runner_loop(r):
    while not stop:
        try:
            s, L = await call("POST", "/api/v1/lease", {"attestation": r.attest(), "wait_s": 5}, timeout=15)
        except Exception:
            stats["conn_err"] += 1; await asyncio.sleep(0.3); continue
        stats[f"lease {s}"] += 1
        if s != 200:
            await asyncio.sleep(0.3); continue
        lid, tok, job = L["lease_id"], L["lease_token"], L["job"]["id"]
        granted.append((time.time(), r.id, job, lid))
        s, _ = await retry("POST", f"/api/v1/leases/{lid}/start", None, tok)
        stats[f"start {s}"] += 1
        await asyncio.sleep(0.05)
        s, _ = await retry("POST", f"/api/v1/leases/{lid}/complete", {"outcome": "succeeded"}, tok)
        stats[f"complete {s}"] += 1

async def main():
    global stop
    pid = start()
    s, _ = jreq("PUT", "/api/v1/admin/pools/crash", {"image_ref": "x", "expected_image_ids": [IMAGE]}, token=ADM)
    runners = [register(f"crash-{i}-{uuid.uuid4().hex[:4]}", pool="crash") for i in range(NR)]
    tasks = [asyncio.create_task(producer())] + [asyncio.create_task(runner_loop(r)) for r in runners]
    t0 = time.monotonic()
    for k in range(KILLS):
        await asyncio.sleep(DUR / (KILLS + 1))
        os.kill(pid, signal.SIGKILL)
        print(f"kill -9 #{k+1} at {time.monotonic()-t0:.1f}s (pid {pid}); granted so far {len(granted)}")
        await asyncio.sleep(0.5)
        pid = await asyncio.get_running_loop().run_in_executor(None, start)
    await asyncio.sleep(DUR / (KILLS + 1))
    stop = True
    await asyncio.wait(tasks, timeout=20)
    print(f"load stopped at {time.monotonic()-t0:.1f}s; client stats {dict(stats)}")
    # ---- checks ----
    now = time.time()
    states = Counter(); problems = []
    leases_by_runner = {}
    for r in runners:
        s, d = jreq("GET", f"/api/v1/admin/runners/{r.id}", token=ADM)
        leases_by_runner[r.id] = {l["lease_id"]: l for l in d["leases"]}
    orphan = []
    for key, jid in jobs.items():
        s, J = jreq("GET", f"/api/v1/jobs/{jid}", token=FRG)
        states[J["state"]] += 1
        # event sequence: no second 'leased' before the previous lease ended
        open_lease = None
        for e in J["events"]:
            if e["kind"] == "leased":
                if open_lease is not None:
                    problems.append(("doubly leased", jid, open_lease, e["lease_id"]))
                open_lease = e["lease_id"]
            elif e["kind"] in ("returned", "requeued", "completed", "failed", "cancelled"):
                open_lease = None
        if J["state"] in ("leased", "running"):
            lid = J["lease_id"]
            if lid is None or lid != open_lease:
                problems.append(("leased without its lease", jid, J["state"], lid, open_lease)); continue
            runner = next(e["runner_id"] for e in J["events"] if e["lease_id"] == lid and e["kind"] == "leased")
            l = leases_by_runner.get(runner, {}).get(lid)
            if l is None:
                problems.append(("lease not in runner detail", jid, lid)); continue
            if l["state"] not in ("leased", "running"):
                problems.append(("job leased, lease not live", jid, l["state"]))
            orphan.append((jid, J["state"], l["state"], l["expires_at"]))
        if J["state"] == "queued" and J["lease_id"] is not None:
            problems.append(("queued with a lease", jid))
    # cross-check: the same job granted twice to the client while the first lease was live
    per_job = defaultdict(list)
    for t, rid, job, lid in granted: per_job[job].append(lid)
    multi = {j: l for j, l in per_job.items() if len(l) > 1}
    print(f"jobs tracked {len(jobs)}; states {dict(states)}; leases granted to clients {len(granted)}; "
          f"jobs granted more than once {len(multi)}")
    print(f"jobs leased/running at the end: {len(orphan)}")
    for o in orphan[:20]: print("   ", o)
    print(f"PROBLEMS: {len(problems)}")
    for p in problems[:20]: print("   ", p)
    s, p = jreq("GET", "/api/v1/admin/pools/crash", token=ADM); print("pool queued_jobs", p["queued_jobs"])
    os.kill(pid, signal.SIGTERM)

asyncio.run(main())

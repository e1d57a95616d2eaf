"""bench/outside.sh's report: wrk's figures, what the service itself counted, the CPU each side
used, and the performance goals' ratios from outside beside the in-process bench's, same run;
then curl's transfers, direct, through the gate and through HAProxy.

    python3 bench/outside_report.py DIR ENGINE CLIENTS WRK_THREADS SECONDS CLK_TCK TRANSFER_MB
"""

import json
import re
import sys
from pathlib import Path

KINDS = ["grants", "heartbeats", "refusals", "forge-forwarded", "forge-direct", "forge-refused",
         "readyz", "livez"]
# The status each kind counts as ok (a refused lease is a 409 probe_failed).
EXPECT = {"grants": 200, "heartbeats": 200, "refusals": 409, "forge-forwarded": 200,
          "forge-direct": 200, "forge-refused": 200, "readyz": 200, "livez": 200}
# What the service counts, per kind, beside its answers by route and status.
COUNTERS = {
    "heartbeats": "leasegate_attestations_total",
    "refusals": "leasegate_lease_refusals_total",
    "forge-forwarded": "leasegate_forge_fetches_total",
    "forge-refused": "leasegate_forge_fetches_total",
}
SAMPLE = re.compile(r"^([a-z_]+)\{(.*)\} ([0-9.e+]+)$")


def samples(path):
    """Every labelled sample of a metrics scrape: {(name, labels): value}."""
    out = {}
    for line in Path(path).read_text().splitlines():
        m = SAMPLE.match(line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def counted(d, kind):
    """What the service counted during a kind's run: its answers by route and status, and
    its own counter of the outcome, each as `labels: delta`."""
    before, after = samples(d / f"{kind}.metrics-before"), samples(d / f"{kind}.metrics-after")
    deltas = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    answers, outcomes = {}, {}
    for (name, labels), delta in deltas.items():
        if name == "leasegate_http_request_duration_seconds_count":
            answers[labels] = int(delta)
        elif name == COUNTERS.get(kind):
            outcomes[labels] = int(delta)
    return answers, outcomes


def wrk_result(d, kind):
    for line in (d / f"{kind}.wrk").read_text().splitlines():
        if line.startswith("outside "):
            return json.loads(line[len("outside "):])
    raise SystemExit(f"outside: wrk printed no result for {kind}:\n" + (d / f"{kind}.wrk").read_text())


def ratio(n, d):
    return n / d if n is not None and d else None


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def transfers(d, mb, inproc):
    """The transfers' medians (MB/s) per way and path, and their ratios beside the in-process
    bench's gate ÷ direct."""
    seconds = {}
    for line in (d / "transfers").read_text().splitlines():
        way, path, took = line.split()
        seconds.setdefault((way, path), []).append(float(took))
    rate = {k: mb / median(v) for k, v in seconds.items()}
    forge = inproc.get("forge") or {}
    print(f"transfers, {mb:g} MB each way (curl, median of 3, MB/s)   direct     gate  haproxy"
          f"  gate/direct  haproxy/direct  gate/haproxy  in-process gate/direct")
    for way in ("upload", "download"):
        direct, gate, proxy = (rate.get((way, p)) for p in ("direct", "gate", "haproxy"))
        in_gate, in_direct = forge.get(f"{way}_gate_mb_per_s"), forge.get(f"{way}_direct_mb_per_s")
        print(f"{way:<52} {fmt(direct, 0):>8} {fmt(gate, 0):>8} {fmt(proxy, 0):>8} "
              f"{fmt(ratio(gate, direct)) + 'x':>12} {fmt(ratio(proxy, direct)) + 'x':>15} "
              f"{fmt(ratio(gate, proxy)) + 'x':>13} {fmt(ratio(in_gate, in_direct)) + 'x':>22}")


def main():
    d, engine, clients, threads, seconds, tck, mb = sys.argv[1:8]
    d, tck = Path(d), float(tck)
    emitted = json.loads((d / "emitted.json").read_text())
    inproc = json.loads((d / "inproc.json").read_text())
    in_rate = {o["op"]: o for o in inproc["ops"]}

    print(f"leasegate from outside: engine {engine}, wrk {threads} threads x {clients} connections, "
          f"{seconds} s per kind, the service, wrk and the bench on the same cores")
    print(f"{'kind':<14} {'requests':>9} {'ok':>9} {'per s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'service CPU':>12} {'wrk CPU':>9} {'in-process':>10}  the service counted")
    out, p50 = {}, {}
    for kind in KINDS:
        w = wrk_result(d, kind)
        seconds_run = w["duration_us"] / 1e6
        answers, outcomes = counted(d, kind)
        # wrk counts statuses above 399 as errors: for a refusal they are the expected ones,
        # as many as the service answered with the expected status (not, say, an expired
        # attestation's 401).
        if EXPECT[kind] >= 400:
            expected = sum(n for k, n in answers.items() if f'status="{EXPECT[kind]}"' in k)
            ok = min(w["status_errors"], expected)
        else:
            ok = w["requests"] - w["status_errors"]
        rate = ok / seconds_run
        b, a = (float(x) for x in (d / f"{kind}.service-cpu").read_text().split())
        service_us = (a - b) / tck / max(w["requests"], 1) * 1e6
        user, system = (float(x) for x in (d / f"{kind}.wrk-cpu").read_text().split()[-2:])
        wrk_us = (user + system) / max(w["requests"], 1) * 1e6
        # Not the scrapes themselves, nor a stopped thread's last request (`/livez`).
        told = "; ".join(f"{k} +{v}" for k, v in sorted(answers.items())
                         if "/metrics" not in k and ("/livez" not in k or kind == "livez"))
        if outcomes:
            told += " | " + "; ".join(f"{k} +{v}" for k, v in sorted(outcomes.items()))
        inp = in_rate.get(kind)
        print(f"{kind:<14} {w['requests']:>9} {ok:>9} {rate:>8.0f} {w['p50_ms']:>7.2f} {w['p99_ms']:>7.2f} "
              f"{service_us:>9.0f} us {wrk_us:>6.0f} us {fmt(inp and inp['per_second'], 0):>10}  {told}")
        if w["socket_errors"] or w["timeouts"]:
            print(f"  {kind}: {w['socket_errors']} socket errors, {w['timeouts']} timeouts")
        if w["threads_out_of_requests"]:
            print(f"  {kind}: {w['threads_out_of_requests']} wrk threads ran out of requests: "
                  f"the rate is a lower bound")
        out[kind] = rate
        p50[kind] = w["p50_ms"]

    v_out = emitted["limits"]["verifications_per_second_all_cores"]
    v_in = inproc["limits"]["verifications_per_second_all_cores"]
    cores = emitted["limits"]["cores"]
    print(f"raw EdDSA verifications x {cores} cores: {v_out:.0f}/s (outside run, before wrk), "
          f"{v_in:.0f}/s (in-process run, after its phases)")
    # The claim limits are the in-process run's (it has the database): the raw claim loop on
    # SQLite, pgbench running the gate's claim on PostgreSQL.
    claims = inproc["limits"].get("pgbench_claims_per_second") if engine == "postgres" \
        else inproc["limits"].get("raw_claims_per_second")
    claims_name = "pgbench's claim" if engine == "postgres" else "raw claim loop"
    rows = [
        (f"grants / {claims_name} (in-process's)", ratio(out["grants"], claims),
         ratio(in_rate.get("grants", {}).get("per_second"), claims)),
        ("heartbeats / (verifications x cores)", ratio(out["heartbeats"], v_out),
         ratio(in_rate.get("heartbeats", {}).get("per_second"), v_in)),
        ("refusals / (verifications x cores)", ratio(out["refusals"], v_out),
         ratio(in_rate.get("refusals", {}).get("per_second"), v_in)),
        ("refused forge fetches / /readyz", ratio(out["forge-refused"], out["readyz"]),
         ratio(in_rate.get("forge-refused", {}).get("per_second"),
               in_rate.get("readyz", {}).get("per_second"))),
        ("refused forge fetches / /livez", ratio(out["forge-refused"], out["livez"]), None),
    ]
    print(f"{'ratio':<40} {'outside (wrk)':>14} {'in-process':>11}")
    for name, o, i in rows:
        print(f"{name:<40} {fmt(o) + 'x':>14} {fmt(i) + 'x' if i is not None else 'n/a':>11}")
    added = p50["forge-forwarded"] - p50["forge-direct"]
    in_added = (inproc.get("forge") or {}).get("forwarded_p50_added_ms")
    print(f"{'forwarded fetch p50 added (1 client, ms)':<40} {fmt(added):>14} {fmt(in_added):>11}")
    transfers(d, float(mb), inproc)


if __name__ == "__main__":
    main()

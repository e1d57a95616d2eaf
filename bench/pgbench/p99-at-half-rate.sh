#!/usr/bin/env bash
# Lease latency at half the maximum rate, against pgbench's for the same claim at half its own
# maximum, on the same PostgreSQL in one run.
#
#   bench/pgbench/p99-at-half-rate.sh [postgres://user@host:port]   (default: the local server)
#
# Needs pgbench, psql and a release build. Creates and drops databases of its own.
set -euo pipefail
cd "$(dirname "$0")/../.."
server="${1:-postgres://postgres@127.0.0.1:5432}"
clients="${CLIENTS:-32}"
seconds="${SECONDS_PER_RUN:-10}"
db="$server/leasegate_p99"
fresh() { psql "$server/postgres" -qc "DROP DATABASE IF EXISTS leasegate_p99 WITH (FORCE)" -qc "CREATE DATABASE leasegate_p99"; }
trap 'psql "$server/postgres" -qc "DROP DATABASE IF EXISTS leasegate_p99 WITH (FORCE)"' EXIT
mkdir -p target

# 1. Both maxima.
fresh
./target/release/leasegate bench --database-url "$db" --concurrency "$clients" --duration-s "$seconds" \
  --jobs 40000 --phases grants --quiet --json target/p99-max.json >/dev/null
max=$(python3 -c 'import json;print(next(o["per_second"] for o in json.load(open("target/p99-max.json"))["ops"] if o["op"]=="grants"))')
psql "$db" -q -f bench/pgbench/setup.sql
pgmax=$(pgbench -n -M prepared -D pool=pgbench -D runner=pgbench-runner -c "$clients" -j 2 -T "$seconds" -f bench/pgbench/claim.sql "$db" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')

# 2. Each at half its maximum, latencies of every transaction logged.
half=$(python3 -c "print(int($max / 2))")
pghalf=$(python3 -c "print(int($pgmax / 2))")
fresh
./target/release/leasegate bench --database-url "$db" --concurrency "$clients" --duration-s "$seconds" \
  --jobs 40000 --phases grants --rate "$half" --quiet --json target/p99-half.json >/dev/null
psql "$db" -q -f bench/pgbench/setup.sql
logs="$(mktemp -d)"
(cd "$logs" && pgbench -n -M prepared -D pool=pgbench -D runner=pgbench-runner -c "$clients" -j 2 -T "$seconds" -R "$pghalf" -l -f "$OLDPWD/bench/pgbench/claim.sql" "$db" >/dev/null)
python3 - "$max" "$pgmax" "$logs" "$seconds" <<'PY'
import glob, json, sys
mx, pgmax, logs = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
half = json.load(open("target/p99-half.json"))
g = next(o for o in half["ops"] if o["op"] == "grants")
lat = sorted(int(line.split()[2]) for f in glob.glob(logs + "/pgbench_log.*") for line in open(f))
p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] / 1000
print(f"maxima: leasegate grants {mx:.0f}/s, pgbench claim+refill {pgmax:.0f} tx/s")
print(f"leasegate at {g['per_second']:.0f}/s: p50 {g['p50_ms']:.2f} ms, p99 {g['p99_ms']:.2f} ms")
print(f"pgbench at {len(lat) / float(sys.argv[4]):.0f} tx/s: p50 {p(0.5):.2f} ms, p99 {p(0.99):.2f} ms")
print(f"ratio of p99s: {g['p99_ms'] / p(0.99):.2f}x")
PY
rm -rf "$logs"

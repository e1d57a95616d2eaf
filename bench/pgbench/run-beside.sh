#!/usr/bin/env bash
# Measures PostgreSQL's own limit for leasegate's claim with pgbench, beside `leasegate bench`
# on the same database, in one run, and prints the ratio.
#
#   bench/pgbench/run-beside.sh [postgres://user@host:port]   (default: the local server)
#
# Needs pgbench and psql (Debian: postgresql-client) and a release build of leasegate.
# It creates and drops a database of its own, `leasegate_bench`.
set -euo pipefail
cd "$(dirname "$0")/../.."
server="${1:-postgres://postgres@127.0.0.1:5432}"
clients="${CLIENTS:-32}"
seconds="${SECONDS_PER_RUN:-10}"
db="$server/leasegate_bench"
psql "$server/postgres" -qc "DROP DATABASE IF EXISTS leasegate_bench WITH (FORCE)"
psql "$server/postgres" -qc "CREATE DATABASE leasegate_bench"
trap 'psql "$server/postgres" -qc "DROP DATABASE IF EXISTS leasegate_bench WITH (FORCE)"' EXIT

# leasegate first: it migrates the database and measures its grants and its raw claims.
./target/release/leasegate bench --database-url "$db" --concurrency "$clients" \
  --duration-s "$seconds" --jobs 40000 --phases grants --quiet --json target/bench-pg-beside.json

# pgbench on the same schema: a pool and a runner of its own, a queue of 10k jobs kept full.
psql "$db" -q -f bench/pgbench/setup.sql
pgbench -n -M prepared -D pool=pgbench -D runner=pgbench-runner -c "$clients" -j 2 -T "$seconds" -f bench/pgbench/claim.sql "$db" | tee target/pgbench-claim.txt

grants=$(python3 -c 'import json;print(next(o["per_second"] for o in json.load(open("target/bench-pg-beside.json"))["ops"] if o["op"]=="grants"))')
tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' target/pgbench-claim.txt | head -1)
python3 - "$grants" "$tps" <<'PY'
import sys
grants, tps = float(sys.argv[1]), float(sys.argv[2])
print(f"leasegate grants {grants:.0f}/s through HTTP; pgbench claim+refill {tps:.0f} tx/s; ratio {grants / tps:.2f}x")
PY

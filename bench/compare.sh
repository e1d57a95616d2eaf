#!/usr/bin/env bash
# Two builds of leasegate measured in one run by one load generator: each binary serves its
# own fresh database as a process of its own, and NEW's `leasegate bench --server` drives it
# (with --server-pid, so that what the service writes to storage is counted), alternating
# OLD, NEW, OLD, NEW… ROUNDS times. Prints each run's line and the median per binary.
#
#   bench/compare.sh OLD_BINARY NEW_BINARY sqlite|postgres [ROUNDS] [bench options…]
#
# PostgreSQL: a database per run on $PGURL (default postgres://postgres@127.0.0.1:5432),
# created and dropped here. Everything listens on 127.0.0.1 and stops by itself.
set -euo pipefail
OLD=$(realpath "$1") NEW=$(realpath "$2") ENGINE=$3 ROUNDS=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
EXTRA=("$@")
[ ${#EXTRA[@]} -gt 0 ] || EXTRA=(--jobs 60000 --phases grants,heartbeats,refusals --duration-s 5)
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
ADMIN=compare-admin-token-0123456789abcdef0123456789
FORGE=compare-forge-token-0123456789abcdef0123456789
OUT=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for round in $(seq "$ROUNDS"); do
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    dir=$(mktemp -d)
    case $ENGINE in
      sqlite) url="sqlite://$dir/leasegate.db" ;;
      postgres)
        db="lgcompare_${which}_${round}_$$"
        psql "$PGURL/postgres" -qc "CREATE DATABASE $db" >/dev/null
        url="$PGURL/$db" ;;
      *) echo "engine: sqlite or postgres" >&2; exit 2 ;;
    esac
    port=$(free_port)
    DATABASE_URL=$url LEASEGATE_ADMIN_TOKEN=$ADMIN LEASEGATE_FORGE_TOKEN=$FORGE \
      LEASEGATE_LISTEN=127.0.0.1:$port LEASEGATE_DB_MAX_CONNECTIONS=40 \
      "$bin" serve >"$dir/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
    "$NEW" bench --quiet --server "http://127.0.0.1:$port" --server-pid "$pid" \
      --database-url "$url" --admin-token "$ADMIN" --forge-token "$FORGE" \
      --json "$OUT/$which-$round.json" "${EXTRA[@]}" >/dev/null
    kill "$pid"; wait "$pid" 2>/dev/null || true
    [ "$ENGINE" = postgres ] && psql "$PGURL/postgres" -qc "DROP DATABASE $db" >/dev/null
    rm -rf "$dir"
    echo "round $round: $which done" >&2
  done
done

python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {w: [json.load(open(f"{out}/{w}-{r}.json")) for r in range(1, rounds + 1)] for w in ("old", "new")}
ops = [o["op"] for o in runs["new"][0]["ops"]]
def fmt(v, unit=""): return "n/a" if v is None else f"{v:,.0f}{unit}"
for w in ("old", "new"):
    for r, rep in enumerate(runs[w], 1):
        cells = []
        for o in rep["ops"]:
            b = o.get("bytes_written_per_op")
            cells.append(f'{o["op"]} {o["per_second"]:,.0f}/s' + (f' {b/1000:.1f} KB' if b is not None else ""))
        raw = rep["limits"].get("raw_claims_per_second")
        print(f"{w} run {r}: " + ", ".join(cells) + f", raw claims {fmt(raw, '/s')}")
print("median per binary (new / old):")
for op in ops:
    med = {w: statistics.median(next(o for o in rep["ops"] if o["op"] == op)["per_second"] for rep in runs[w]) for w in runs}
    line = f"  {op}: old {med['old']:,.0f}/s, new {med['new']:,.0f}/s, {med['new']/med['old']:.2f}x"
    bytes_ = {w: [next(o for o in rep["ops"] if o["op"] == op).get("bytes_written_per_op") for rep in runs[w]] for w in runs}
    if all(b is not None for b in bytes_["old"] + bytes_["new"]):
        bo, bn = statistics.median(bytes_["old"]), statistics.median(bytes_["new"])
        line += f"; written per request old {bo/1000:.1f} KB, new {bn/1000:.1f} KB"
    print(line)
for w in runs:
    l = runs[w][0]["limits"]
    print(f"  {w}: verifications {l['verifications_per_second_all_cores']:,.0f}/s on {l['cores']} cores")
EOF

#!/usr/bin/env bash
# What two builds write to storage per heartbeat and per refusal on SQLite, counted from
# outside: each phase on a fresh database served by a process of its own, its `write_bytes`
# (/proc/PID/io) read before NEW's `leasegate bench --server` starts and 3 s after it ends,
# so that a checkpoint the load left due is counted too, less what making the fleet wrote
# (a run of the same binary with no phase). OLD and NEW alternate, ROUNDS times.
#
#   bench/written.sh OLD_BINARY NEW_BINARY [ROUNDS] [bench options…]
#
# Everything listens on 127.0.0.1 and stops by itself.
set -euo pipefail
OLD=$(realpath "$1") NEW=$(realpath "$2") ROUNDS=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
EXTRA=("$@")
ADMIN=written-admin-token-0123456789abcdef0123456789
FORGE=written-forge-token-0123456789abcdef0123456789
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
written() { awk '/^write_bytes/ {print $2}' "/proc/$1/io"; }

# run BINARY PHASE: prints "bytes ok" (ok: the phase's successful requests).
run() {
  local dir port pid before after ok
  dir=$(mktemp -d)
  port=$(free_port)
  DATABASE_URL="sqlite://$dir/leasegate.db" LEASEGATE_ADMIN_TOKEN=$ADMIN \
    LEASEGATE_FORGE_TOKEN=$FORGE LEASEGATE_LISTEN=127.0.0.1:$port "$1" serve >"$dir/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
  sleep 1
  before=$(written "$pid")
  "$NEW" bench --quiet --server "http://127.0.0.1:$port" --admin-token "$ADMIN" \
    --forge-token "$FORGE" --json "$dir/out.json" --jobs 100 --duration-s 5 \
    "${EXTRA[@]}" --phases "$2" >/dev/null
  sleep 3
  after=$(written "$pid")
  ok=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sum(o['ok'] for o in r['ops']))" "$dir/out.json")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  echo "$((after - before)) $ok"
}

declare -A setup
for which in old new; do
  bin=$OLD; [ "$which" = new ] && bin=$NEW
  read -r bytes _ < <(run "$bin" "")
  setup[$which]=$bytes
  echo "$which: making the fleet wrote $bytes bytes" >&2
done
for round in $(seq "$ROUNDS"); do
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    for phase in heartbeats refusals; do
      read -r bytes ok < <(run "$bin" "$phase")
      python3 -c "import sys; b, s, ok = map(int, sys.argv[4:7]); print(f'round {sys.argv[1]} {sys.argv[2]:3} {sys.argv[3]:10} {ok / 5:7.0f}/s {(b - s) / ok / 1000:5.2f} KB per request')" \
        "$round" "$which" "$phase" "$bytes" "${setup[$which]}" "$ok"
    done
  done
done

#!/usr/bin/env bash
# The service's instructions per request of one phase, counted by callgrind: a figure that a
# busy shared machine does not move, where a rate does. Each binary serves a fresh SQLite
# database under `valgrind --tool=callgrind`; the first binary's `leasegate bench --server`
# drives it twice at a fixed rate, SHORT then LONG seconds of PHASE, and the counts are dumped
# after each. Both runs make the same fleet, so (Ir_long - Ir_short) / (n_long - n_short) is
# what one request of the phase costs the service, the fleet's making and start-up cancelled.
#
#   bench/callgrind.sh heartbeats|refusals BINARY...
#
# RATE (default 40/s), SHORT (4) and LONG (12) may be set; ONLY='*Gate::admit_with*' counts
# only what runs inside the functions it names (callgrind's --toggle-collect: here the gate's
# own work, the round's writes left out). Everything listens on 127.0.0.1.
set -euo pipefail
PHASE=$1
shift
BINS=()
for b in "$@"; do BINS+=("$(realpath "$b")"); done
RATE=${RATE:-40} SHORT=${SHORT:-4} LONG=${LONG:-12}
ADMIN=callgrind-admin-token-0123456789abcdef0123456789
FORGE=callgrind-forge-token-0123456789abcdef0123456789
OUT=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$OUT"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The total of a dump's events (its `totals:` line; `summary:` in older formats).
total() { awk '/^(totals|summary):/ {print $2}' "$1" | tail -1; }
ok_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ops"][0]["ok"])' "$1"; }

for bin in "${BINS[@]}"; do
  dir=$(mktemp -d -p "$OUT")
  port=$(free_port)
  DATABASE_URL="sqlite://$dir/leasegate.db" LEASEGATE_ADMIN_TOKEN=$ADMIN \
    LEASEGATE_FORGE_TOKEN=$FORGE LEASEGATE_LISTEN=127.0.0.1:$port RUST_LOG=warn \
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" \
    ${ONLY:+--collect-atstart=no "--toggle-collect=$ONLY"} "$bin" serve \
    >"$dir/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
  counts=()
  for seconds in "$SHORT" "$LONG"; do
    callgrind_control -z "$pid" >/dev/null 2>&1
    "${BINS[0]}" bench --quiet --server "http://127.0.0.1:$port" --admin-token "$ADMIN" \
      --forge-token "$FORGE" --runners 20 --broken 5 --jobs 0 --concurrency 4 \
      --phases "$PHASE" --rate "$RATE" --duration-s "$seconds" \
      --json "$dir/$seconds.json" >/dev/null
    before=$(ls "$dir"/cg.* | wc -l)
    callgrind_control -d "$pid" >/dev/null 2>&1
    for _ in $(seq 100); do [ "$(ls "$dir"/cg.* | wc -l)" -gt "$before" ] && break; sleep 0.2; done
    counts+=("$(total "$(ls -t "$dir"/cg.* | head -1)") $(ok_of "$dir/$seconds.json")")
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
  read -r ir1 n1 <<<"${counts[0]}"
  read -r ir2 n2 <<<"${counts[1]}"
  python3 -c "import sys; ir1,n1,ir2,n2=map(int,sys.argv[2:]); \
print(f'{sys.argv[1]}: {(ir2-ir1)/(n2-n1):,.0f} instructions per request ({n1} and {n2} requests)')" \
    "$bin" "$ir1" "$n1" "$ir2" "$n2"
done

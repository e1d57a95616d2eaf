#!/usr/bin/env bash
# Holds many waiting long polls against a `leasegate serve` of its own (a separate process, so
# that each end's sockets and memory are its own), and reports the service's resident memory
# per waiting poll and how soon a waiter wakes on an enqueue.
#
#   bench/long-polls.sh [WAITERS] [DATABASE_URL]   (default: 10000, a temporary SQLite file)
#
# Needs a release build of leasegate. Listens on 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
waiters="${1:-10000}"
dir="$(mktemp -d)"
database_url="${2:-sqlite://$dir/longpolls.db}"
port="${PORT:-18180}"
export LEASEGATE_ADMIN_TOKEN="$(openssl rand -hex 32)" LEASEGATE_FORGE_TOKEN="$(openssl rand -hex 32)"
RUST_LOG=warn ./target/release/leasegate serve --listen "127.0.0.1:$port" --database-url "$database_url" \
  >"$dir/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
./target/release/leasegate bench --server "http://127.0.0.1:$port" --server-pid "$server" \
  --jobs 0 --phases "" --long-polls "$waiters" --quiet --json target/bench-long-polls.json

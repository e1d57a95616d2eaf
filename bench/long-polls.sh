#!/usr/bin/env bash
# Holds many waiting long polls against a `leasegate serve` of its own (a separate process, so
# that each end's sockets and memory are its own), and reports the service's resident memory
# per waiting poll and how soon a waiter wakes on an enqueue.
#
#   bench/long-polls.sh [WAITERS] [DATABASE_URL]   (default: 10000, a temporary SQLite file)
#
# Needs a release build of leasegate. Listens on 127.0.0.1 only. Every poll comes from one
# address, so the service is told to take that many from one peer (its default per-peer cap,
# a quarter of its connections, would stop the bench at a quarter of them), and each end gets
# the file limit its sockets need.
set -euo pipefail
cd "$(dirname "$0")/.."
waiters="${1:-10000}"
dir="$(mktemp -d)"
database_url="${2:-sqlite://$dir/longpolls.db}"
port="${PORT:-18180}"
export LEASEGATE_ADMIN_TOKEN="$(openssl rand -hex 32)" LEASEGATE_FORGE_TOKEN="$(openssl rand -hex 32)"
# Each waiting poll is a socket at each end; the rest is room for the database and the bench's
# own requests.
needed=$((waiters + 1024))
ulimit -n "$(( $(ulimit -Hn) < needed * 2 ? $(ulimit -Hn) : needed * 2 ))"
if [ "$(ulimit -n)" -lt "$needed" ]; then
  echo "long-polls: $waiters polls need $needed open files; the hard limit is $(ulimit -Hn)" >&2
  exit 1
fi
export LEASEGATE_MAX_CONNECTIONS="$((waiters + 256))" LEASEGATE_MAX_CONNECTIONS_PER_PEER="$((waiters + 256))"
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

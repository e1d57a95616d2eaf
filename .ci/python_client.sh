#!/usr/bin/env bash
# Generate a Python client from the running service's /openapi.json with
# openapi-python-client, and run the README's walk-through with it (.ci/python_client.py)
# against a fresh `leasegate serve` on a temporary SQLite file, on 127.0.0.1 and a free port,
# stopped when this script exits.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v openapi-python-client >/dev/null 2>&1 || python3 -m pip install --quiet openapi-python-client
python3 -c 'import cryptography' 2>/dev/null || python3 -m pip install --quiet cryptography

cargo build --locked --quiet --bin leasegate
# Where cargo put it: the target directory may be set elsewhere (CARGO_TARGET_DIR).
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$(pwd)/$target_dir" ;; esac
bin="$target_dir/debug/leasegate"

work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export LEASEGATE_ADMIN_TOKEN="python-client-admin-token-0123456789abcdef"
export LEASEGATE_FORGE_TOKEN="python-client-forge-token-0123456789abcdef"
export LEASEGATE_URL="http://127.0.0.1:$port"

LEASEGATE_LISTEN="127.0.0.1:$port" \
  DATABASE_URL="sqlite://$work/leasegate.db" \
  RUST_LOG="${RUST_LOG:-warn}" \
  "$bin" serve >"$work/serve.log" 2>&1 &
pid=$!

for _ in $(seq 1 100); do
  curl -fsS "$LEASEGATE_URL/livez" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.1
done

curl -fsS "$LEASEGATE_URL/openapi.json" >"$work/openapi.json"
# /metrics answers OpenMetrics text, which the generator leaves out (it says so): that
# warning is expected; anything it cannot generate would fail the walk-through's imports.
openapi-python-client generate --path "$work/openapi.json" --meta none \
  --output-path "$work/leasegate_client" >"$work/generate.log" 2>&1 \
  || { cat "$work/generate.log"; exit 1; }

status=0
PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}" python3 .ci/python_client.py || status=$?
if [ "$status" -ne 0 ]; then
  echo "== leasegate serve's log (tail)"
  tail -n 50 "$work/serve.log"
fi
exit "$status"

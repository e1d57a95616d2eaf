#!/usr/bin/env bash
# Fuzz the running service against its own OpenAPI document with schemathesis: every check,
# every phase, a fixed seed and a bounded number of cases, so that a failure is reproducible
# and the run stays short. The service is a fresh `leasegate serve` on a temporary SQLite
# file, on 127.0.0.1 and a free port, stopped when this script exits.
set -euo pipefail
cd "$(dirname "$0")/.."

SEED="${SCHEMATHESIS_SEED:-20261201}"
MAX_EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-25}"

python3 -c 'import schemathesis' 2>/dev/null || python3 -m pip install --quiet schemathesis

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
export LEASEGATE_ADMIN_TOKEN="schemathesis-admin-token-0123456789abcdef"
export LEASEGATE_FORGE_TOKEN="schemathesis-forge-token-0123456789abcdef"

# The fuzzer sends wrong credentials on purpose (the `ignored_auth` check): the throttle must
# not start answering 429 to it.
LEASEGATE_LISTEN="127.0.0.1:$port" \
  DATABASE_URL="sqlite://$work/leasegate.db" \
  LEASEGATE_AUTH_FAILURE_LIMIT=1000000 \
  RUST_LOG="${RUST_LOG:-warn}" \
  "$bin" serve >"$work/serve.log" 2>&1 &
pid=$!

base="http://127.0.0.1:$port"
for _ in $(seq 1 100); do
  curl -fsS "$base/livez" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.1
done

# Run from the temporary directory, so that schemathesis' own cache (`.schemathesis/`) starts
# empty each time and stays out of the work tree: the same seed then makes the same cases.
ci="$(pwd)/.ci"
status=0
(cd "$work" && PYTHONPATH="$ci${PYTHONPATH:+:$PYTHONPATH}" SCHEMATHESIS_HOOKS=schemathesis_hooks \
  schemathesis --config-file "$ci/schemathesis.toml" run "$base/openapi.json" \
  --checks all \
  --phases examples,coverage,fuzzing,stateful \
  --seed "$SEED" \
  --max-examples "$MAX_EXAMPLES" \
  --workers 1 \
  --request-timeout 10 \
  --suppress-health-check all \
  "$@") || status=$?

if [ "$status" -ne 0 ]; then
  echo "== leasegate serve's log (tail)"
  tail -n 50 "$work/serve.log"
fi
exit "$status"

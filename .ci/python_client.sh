#!/usr/bin/env bash
# Generate a Python client from the running service's /openapi.json with
# openapi-python-client, and run the README's walk-through with it (.ci/python_client.py)
# against a fresh `leasegate serve` on a temporary SQLite file, on 127.0.0.1 and a free port,
# stopped when this script exits.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v openapi-python-client >/dev/null 2>&1 || python3 -m pip install --quiet openapi-python-client
python3 -c 'import cryptography' 2>/dev/null || python3 -m pip install --quiet cryptography

export LEASEGATE_ADMIN_TOKEN="python-client-admin-token-0123456789abcdef"
export LEASEGATE_FORGE_TOKEN="python-client-forge-token-0123456789abcdef"
# shellcheck source=.ci/serve_here.sh
. .ci/serve_here.sh
export LEASEGATE_URL="$base"

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

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

export LEASEGATE_ADMIN_TOKEN="schemathesis-admin-token-0123456789abcdef"
export LEASEGATE_FORGE_TOKEN="schemathesis-forge-token-0123456789abcdef"
# The fuzzer sends wrong credentials on purpose (the `ignored_auth` check): the throttle must
# not start answering 429 to it.
export LEASEGATE_AUTH_FAILURE_LIMIT=1000000
# shellcheck source=.ci/serve_here.sh
. .ci/serve_here.sh

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

# Sourced by the CI scripts that need a running service: builds the binary, starts a fresh
# `leasegate serve` on a temporary SQLite file, on 127.0.0.1 and a free port, waits until it
# answers, and stops it (and removes the directory) when the sourcing script exits.
#
# Before sourcing, set LEASEGATE_ADMIN_TOKEN and LEASEGATE_FORGE_TOKEN; any other LEASEGATE_*
# exported then reaches the service. Afterwards: $base (the service's URL), $work (the
# temporary directory, its log in $work/serve.log), $pid.

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
base="http://127.0.0.1:$port"
LEASEGATE_LISTEN="127.0.0.1:$port" \
  DATABASE_URL="sqlite://$work/leasegate.db" \
  RUST_LOG="${RUST_LOG:-warn}" \
  "$bin" serve >"$work/serve.log" 2>&1 &
pid=$!

for _ in $(seq 1 100); do
  curl -fsS "$base/livez" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.1
done

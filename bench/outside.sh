#!/usr/bin/env bash
# The bench's grant, attestation and forge figures measured again from outside the service's process:
# a `leasegate serve` of its own (release build, 127.0.0.1 only) driven by wrk with requests
# that `leasegate bench --emit-requests` signed before any clock started, then the in-process
# `leasegate bench` on the same phases right after, and each ratio of the performance goals
# printed from both, side by side.
#
#   bench/outside.sh                                      a temporary SQLite file
#   bench/outside.sh postgres://postgres@127.0.0.1:5432   two databases of its own on that
#                                                         server, dropped at the end
#
# Settings (environment): SECONDS_PER_PHASE (5), CLIENTS (32: wrk's connections and the
# bench's clients), WRK_THREADS (2), CPUS (0,1: the service, wrk and the in-process bench are
# all pinned to these, so the load generator shares the service's cores, as in the issue's
# runs). Each kind of request is bounded in time (wrk's -d) and in count (each thread stops
# when its share is sent: the attestations written, or 50 000 a second for the others).
# Then TRANSFER_MB (200) each way with curl, three rounds: to a stand-in forge of Python's
# (bench/outside_forge.py) directly, through the gate, and through HAProxy with kernel
# splicing where it is installed (the configuration the bench's forge phase uses).
# Whatever happens, the server is stopped and the files and databases removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${SECONDS_PER_PHASE:-5}"
clients="${CLIENTS:-32}"
wrk_threads="${WRK_THREADS:-2}"
cpus="${CPUS:-0,1}"
runners=100
broken=10
# Every attestation is signed before the first kind runs, and lives 60 s.
if [ "$seconds" -gt 10 ]; then
  echo "outside: SECONDS_PER_PHASE is at most 10 (the attestations, signed first, live 60 s)" >&2
  exit 64
fi
phases=grants,heartbeats,refusals,forge
# Jobs queued for the grants (each grant takes one): more than 5 s of grants at this machine's
# rates; JOBS overrides.
jobs="${JOBS:-60000}"
pg_server=""
if [ $# -gt 0 ]; then
  case "$1" in
    postgres://* | postgresql://*) pg_server="$(printf %s "$1" | sed -E 's#^(postgres(ql)?://[^/?]+).*#\1#')" ;;
    *) echo "usage: bench/outside.sh [postgres://USER@HOST:PORT]" >&2; exit 64 ;;
  esac
fi
transfer_mb="${TRANSFER_MB:-200}"
for tool in wrk curl python3 taskset /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "outside: $tool is needed" >&2; exit 1; }
done
[ -z "$pg_server" ] || command -v psql >/dev/null || { echo "outside: psql is needed" >&2; exit 1; }

dir="$(mktemp -d)"
server=""
helpers=()
databases=()
cleanup() {
  status=$?
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  for pid in "${helpers[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for db in "${databases[@]}"; do
    psql -q "$pg_server/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 ||
      echo "outside: could not drop database $db" >&2
  done
  rm -rf "$dir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cargo build --release --locked --quiet
bin=./target/release/leasegate
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ -n "$pg_server" ]; then
  for side in wrk inproc; do
    db="lg_outside_$$_$side"
    psql -q "$pg_server/postgres" -c "CREATE DATABASE $db" >/dev/null
    databases+=("$db")
  done
  outside_url="$pg_server/lg_outside_$$_wrk"
  inproc_args=(--database-url "$pg_server/lg_outside_$$_inproc")
  engine=postgres
else
  outside_url="sqlite://$dir/outside.db"
  inproc_args=()
  engine=sqlite
fi

# The stand-in forge, and HAProxy in front of it where it is installed.
forge_port="$(free_port)"
python3 bench/outside_forge.py "$forge_port" >"$dir/forge.log" 2>&1 &
helpers+=($!)
proxy=""
if command -v haproxy >/dev/null; then
  proxy_port="$(free_port)"
  # The configuration the in-process bench's forge phase runs HAProxy with.
  sed -e "s/@PORT@/$proxy_port/" -e "s/@UPSTREAM@/127.0.0.1:$forge_port/" \
    bench/haproxy-splice.cfg >"$dir/haproxy.cfg"
  taskset -c "$cpus" haproxy -db -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 &
  helpers+=($!)
  proxy="http://127.0.0.1:$proxy_port"
fi

# The service, as the in-process bench starts its own: logging at warn (a line per request
# would be measured too), as many database connections as clients and a few, and a Forgejo
# to gate in front of: the stand-in. A refused fetch never reaches it; a fetch that did would
# be answered 404 and counted as an error.
port="${PORT:-$(free_port)}"
base="http://127.0.0.1:$port"
admin="$(openssl rand -hex 32)"
forge="$(openssl rand -hex 32)"
RUST_LOG=warn LEASEGATE_ADMIN_TOKEN="$admin" LEASEGATE_FORGE_TOKEN="$forge" \
  LEASEGATE_DB_MAX_CONNECTIONS="$((clients + 4))" \
  LEASEGATE_FORGEJO_UPSTREAM="http://127.0.0.1:$forge_port" \
  taskset -c "$cpus" "$bin" serve --listen "127.0.0.1:$port" --database-url "$outside_url" >"$dir/serve.log" 2>&1 &
server=$!  # taskset execs the service: this is its pid
for _ in $(seq 100); do
  curl -fsS "$base/readyz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { cat "$dir/serve.log" >&2; exit 1; }
  sleep 0.1
done
curl -fsS "$base/readyz" >/dev/null

# The fleet registered with the service and its requests written; then, the service idle, the
# raw verification rate (the bench's limit, with the same check the service makes).
taskset -c "$cpus" "$bin" bench --server "$base" --admin-token "$admin" --forge-token "$forge" --quiet \
  --runners "$runners" --broken "$broken" --jobs "$jobs" --concurrency "$clients" \
  --duration-s "$seconds" --phases "$phases" --emit-requests "$dir/requests" \
  --json "$dir/emitted.json" >"$dir/emitted.log"
printf 'GET /readyz\n' >"$dir/requests/readyz.head"
printf 'GET /livez\n' >"$dir/requests/livez.head"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The admitted runner's fetch (forge-forwarded) and the same fetch sent to the stand-in directly
# (forge-direct) go one at a time, over one connection, right after the refusals: its
# attestation, made when the requests were written, is fresh for a minute.
for kind in grants heartbeats refusals forge-forwarded forge-direct forge-refused readyz livez; do
  request="$kind" to="$base" threads="$wrk_threads" connections="$clients"
  case "$kind" in
    grants | heartbeats | refusals) bodies="$dir/requests/$kind.bodies" ;;
    forge-forwarded | forge-direct)
      request=forge-forwarded threads=1 connections=1 bodies="$dir/requests/forge-forwarded.body"
      [ "$kind" = forge-direct ] && to="http://127.0.0.1:$forge_port" ;;
    forge-refused) bodies="$dir/requests/$kind.body" ;;
    *) bodies=- ;;
  esac
  curl -fsS "$base/metrics" >"$dir/$kind.metrics-before"
  before="$(cpu_ticks "$server")"
  taskset -c "$cpus" /usr/bin/time -f '%U %S' -o "$dir/$kind.wrk-cpu" \
    wrk -t "$threads" -c "$connections" -d "${seconds}s" --timeout 10s -s bench/outside.lua "$to" \
    -- "$dir/requests/$request.head" "$bodies" "$threads" "$((50000 * seconds))" >"$dir/$kind.wrk"
  echo "$before $(cpu_ticks "$server")" >"$dir/$kind.service-cpu"
  curl -fsS "$base/metrics" >"$dir/$kind.metrics-after"
  sleep 1
done
# The transfers: each way, direct, through the gate and through HAProxy in turn, three rounds.
size=$((transfer_mb * 1000000))
head -c "$size" /dev/zero >"$dir/body"
artifact=/api/actions_pipeline/outside
for round in 1 2 3; do
  for way in upload download; do
    for path in direct gate haproxy; do
      case "$path" in
        direct) to="http://127.0.0.1:$forge_port" ;;
        gate) to="$base" ;;
        haproxy) [ -n "$proxy" ] || continue; to="$proxy" ;;
      esac
      if [ "$way" = upload ]; then
        took="$(taskset -c "$cpus" curl -fsS -o "$dir/answer" -w '%{time_total}' -H 'Expect:' \
          -H 'content-type: application/octet-stream' --data-binary @"$dir/body" "$to$artifact/upload")"
        [ "$(cat "$dir/answer")" = "$size" ] ||
          { echo "outside: the upload through $path arrived as $(cat "$dir/answer") bytes" >&2; exit 1; }
      else
        took="$(taskset -c "$cpus" curl -fsS -o /dev/null -w '%{time_total} %{size_download}' \
          "$to$artifact/download/$size")"
        [ "${took#* }" = "$size" ] ||
          { echo "outside: the download through $path got ${took#* } bytes" >&2; exit 1; }
        took="${took%% *}"
      fi
      echo "$way $path $took" >>"$dir/transfers"
    done
  done
done

kill "$server"
wait "$server" || true
server=""

# The in-process bench on the same phases, right after, on the same cores.
taskset -c "$cpus" "$bin" bench --quiet --runners "$runners" --broken "$broken" --jobs "$jobs" --concurrency "$clients" \
  --duration-s "$seconds" --phases "$phases" --forge-body-mb "$transfer_mb" "${inproc_args[@]}" \
  --json "$dir/inproc.json" >"$dir/inproc.log"

python3 bench/outside_report.py "$dir" "$engine" "$clients" "$wrk_threads" "$seconds" "$(getconf CLK_TCK)" "$transfer_mb"

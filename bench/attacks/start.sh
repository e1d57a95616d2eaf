#!/bin/sh
# usage: start.sh NAME DBURL [extra env assignments...]
# Starts the release binary on 127.0.0.1:${PORT:-18080}; writes $ATTACK_DIR/attack-NAME/{pid,env,stderr.log}
# (ATTACK_DIR defaults to /tmp). Build it first: cargo build --release.
NAME=$1; DB=$2; shift 2
D=${ATTACK_DIR:-/tmp}/attack-$NAME; mkdir -p $D
ADMIN=${FIXED_ADMIN:-$(openssl rand -hex 32)}; FORGE=${FIXED_FORGE:-$(openssl rand -hex 32)}
PORT=${PORT:-18080}
printf 'export LG=http://127.0.0.1:%s LG_ADMIN=%s LG_FORGE=%s\n' $PORT $ADMIN $FORGE > $D/env
cd "$(dirname "$0")/../.."
env LEASEGATE_ADMIN_TOKEN=$ADMIN LEASEGATE_FORGE_TOKEN=$FORGE LEASEGATE_LISTEN=127.0.0.1:$PORT DATABASE_URL=$DB "$@" \
  sh -c "${ULIMIT:+ulimit -n $ULIMIT && }exec target/release/leasegate serve" > /dev/null 2>> $D/stderr.log &
echo $! > $D/pid
for i in $(seq 1 100); do
  curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/readyz 2>/dev/null | grep -q 200 && { echo "up pid $(cat $D/pid)"; exit 0; }
  sleep 0.2
done
echo "not ready"; tail $D/stderr.log; exit 1

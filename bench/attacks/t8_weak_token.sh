#!/bin/sh
# Test 8c: start with a short admin token; report exit status and message.
cd "$(dirname "$0")/../.."
mkdir -p ${ATTACK_DIR:-/tmp}/attack-weak
for DB in sqlite://${ATTACK_DIR:-/tmp}/attack-weak/lg.db; do
LEASEGATE_ADMIN_TOKEN=adm-secret LEASEGATE_FORGE_TOKEN=$(openssl rand -hex 32) LEASEGATE_LISTEN=127.0.0.1:18089 \
  DATABASE_URL=$DB timeout 20 target/release/leasegate serve; echo "exit status: $?"
LEASEGATE_ADMIN_TOKEN=$(openssl rand -hex 32) LEASEGATE_FORGE_TOKEN=forge-secret LEASEGATE_LISTEN=127.0.0.1:18089 \
  DATABASE_URL=$DB timeout 20 target/release/leasegate serve; echo "exit status (short forge token): $?"
T=$(openssl rand -hex 32)
LEASEGATE_ADMIN_TOKEN=$T LEASEGATE_FORGE_TOKEN=$T LEASEGATE_LISTEN=127.0.0.1:18089 \
  DATABASE_URL=$DB timeout 20 target/release/leasegate serve; echo "exit status (admin == forge): $?"
echo -n adm-secret > ${ATTACK_DIR:-/tmp}/attack-weak/adm.token
LEASEGATE_ADMIN_TOKEN_FILE=${ATTACK_DIR:-/tmp}/attack-weak/adm.token LEASEGATE_FORGE_TOKEN=$(openssl rand -hex 32) LEASEGATE_LISTEN=127.0.0.1:18089 \
  DATABASE_URL=$DB timeout 20 target/release/leasegate serve; echo "exit status (short token via _FILE): $?"
LEASEGATE_ADMIN_TOKEN="$(printf 'a%.0s' $(seq 1 32))" LEASEGATE_FORGE_TOKEN=$(openssl rand -hex 32) LEASEGATE_LISTEN=127.0.0.1:18089 \
  DATABASE_URL=$DB timeout 3 target/release/leasegate serve 2>&1 | tail -2; echo "exit status (32 x 'a', low-entropy but long): $?"
done

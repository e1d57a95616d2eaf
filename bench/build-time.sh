#!/bin/bash
# Cold builds of two revisions of this repository, alternating (old, new, new, old: release
# builds first, then test builds), each in a fresh clone with an empty target/, so that both
# wait alike for whatever else the machine does. Prints one line per build: what, which
# revision, wall seconds, the load average when it ended.
#
#   bench/build-time.sh OLD_REV NEW_REV
set -euo pipefail
old=${1:?usage: bench/build-time.sh OLD_REV NEW_REV}
new=${2:?usage: bench/build-time.sh OLD_REV NEW_REV}
repo=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for rev in "$old" "$new"; do
  git clone -q "$repo" "$work/$rev"
  git -C "$work/$rev" checkout -q "$rev"
done
build() { # rev what cargo-args...
  local rev=$1 what=$2
  shift 2
  rm -rf "$work/$rev/target"
  local start end
  start=$(date +%s.%N)
  (cd "$work/$rev" && cargo build --locked "$@" >"$work/$rev.$what.log" 2>&1)
  end=$(date +%s.%N)
  printf '%-8s %s %7.1f s  load %s\n' "$what" "$rev" "$(echo "$end - $start" | bc)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
}
build "$old" release --release
build "$new" release --release
build "$new" tests --tests
build "$old" tests --tests

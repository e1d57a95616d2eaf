#!/bin/bash
# Cold builds of two revisions of this repository, alternating (release builds old, new, new,
# old, then test builds new, old, old, new), each in a fresh clone with an empty target/, so
# that both wait alike for whatever else the machine does. Prints one line per build: what, which
# revision, wall seconds, the load average when it ended.
#
#   bench/build-time.sh OLD_REV NEW_REV [release|tests|both]   (default: both)
set -euo pipefail
usage='usage: bench/build-time.sh OLD_REV NEW_REV [release|tests|both]'
old=${1:?$usage}
new=${2:?$usage}
which=${3:-both}
case "$which" in release | tests | both) ;; *) echo "$usage" >&2; exit 64 ;; esac
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
if [ "$which" != tests ]; then
  build "$old" release --release
  build "$new" release --release
  build "$new" release --release
  build "$old" release --release
fi
if [ "$which" != release ]; then
  build "$new" tests --tests
  build "$old" tests --tests
  build "$old" tests --tests
  build "$new" tests --tests
fi

#!/usr/bin/env bash
# `make demo`: starts `testenv demo` in the background (the whole pull
# model on this machine, see test/src/stack.rs), shows its progress until
# the example has converged, and leaves it running for the user to explore.
# Ctrl-C before that stops everything; `make demo-down` stops it later.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?demo folder}
testenv=$root/target/debug/testenv

if [ -f "$dir/testenv.pid" ] && kill -0 "$(cat "$dir/testenv.pid")" 2>/dev/null; then
  echo "A demo is already running (pid $(cat "$dir/testenv.pid")):"
  "$testenv" --dir "$dir" status || true
  echo "Stop it with: make demo-down"
  exit 0
fi
mkdir -p "$dir"
rm -f "$dir/ready"
: >"$dir/demo.log"
# Its own session: it outlives this script, and only we decide when it stops.
ARGOCD_PULL_RUN_DIR="$dir/run" setsid "$testenv" --dir "$dir" demo \
  >"$dir/demo.log" 2>&1 </dev/null &
pid=$!
stop() {
  echo
  echo "Stopping the demo..."
  "$testenv" --dir "$dir" down >/dev/null 2>&1 || kill -KILL "$pid" 2>/dev/null || true
  exit 130
}
trap stop INT TERM
tail -n +1 -f --pid="$pid" "$dir/demo.log" &
tailer=$!
while [ ! -f "$dir/ready" ]; do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$tailer" || true
    echo
    echo "The demo failed; its whole log: $dir/demo.log"
    exit 1
  fi
  sleep 1
done
sleep 1
kill "$tailer" 2>/dev/null || true

#!/usr/bin/env bash
# Runs every test binary of the workspace, one at a time or several side
# by side, and ends
# with what a reader of a long log needs: a table of the binaries by wall
# time, the ten slowest tests, and one closing line `tests: N passed, N
# failed`.
#
#   test/tools/run-tests.sh [--jobs N] [--only REGEX]
#
# Why not `cargo test`: it can only run the binaries one after another,
# and prints no table of where the time went. Why not one process per test (as
# nextest does): the tests of a binary share expensive real clusters
# (`testenv::shared`), which per-test processes would start once each.
#
# Binaries start longest first, by the wall times of the last run (kept in
# $ARGOCD_PULL_CACHE/test-times.tsv; a binary not timed yet counts as the
# longest). Each runs in its package's folder, as `cargo test` runs it, with
# libtest's own thread count; its output is printed whole when it ends. The
# per-test times come from libtest's `--report-time`, an unstable option
# that RUSTC_BOOTSTRAP unlocks at run time for the test binaries only (the
# build stays stable).
#
# ARGOCD_PULL_TEST_JOBS (or --jobs) sets how many binaries run at once
# (two by default, one per core); ARGOCD_PULL_TEST_ALONE, an extended
# regular expression, names the binaries that run with nothing beside
# them: those that run real nodes (kubelet, containerd, pods), whose
# kubelets missed their 120 s readiness on two cores shared with other
# binaries (docs/testing.md);
# --only runs the binaries whose name (`core lib:argocd_pull_core`,
# `test test:e2e`, as the table prints them) matches an extended regular
# expression.
set -uo pipefail

jobs=${ARGOCD_PULL_TEST_JOBS:-2}
alone=${ARGOCD_PULL_TEST_ALONE:-'^test test:(e2e|helm_upgrade|node)$|^hub-controller test:(addon|addon_lifecycle|hostile_identity|grpc_terminal_node|grpc_trees)$'}
only=
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "run-tests.sh: unknown argument $1 (usage: run-tests.sh [--jobs N] [--only REGEX])" >&2; exit 2 ;;
  esac
done
case $jobs in '' | *[!0-9]* | 0) echo "run-tests.sh: --jobs wants a positive number, not '$jobs'" >&2; exit 2 ;; esac

cd "$(dirname "$0")/../.."
cache=${ARGOCD_PULL_CACHE:-$PWD/.cache}
times=$cache/test-times.tsv
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Checks a test could not make here say so in this file (testenv::paths::not_run).
export ARGOCD_PULL_NOT_RUN=$out/not-run.txt
mkdir -p "$cache"

# Build every test target, and list its executable, its name and the folder
# of its package (the working directory `cargo test` gives it).
cargo test --workspace --all-targets --locked --no-run --message-format=json-render-diagnostics \
  >"$out/build.json" || { echo "run-tests.sh: the tests did not build" >&2; exit 101; }
# A binary's name: its package's folder, its kind and its target
# (`hub-controller test:grpc`, `core lib:argocd_pull_core`), numbered when
# a target is built twice (a crate's unit tests with two sets of features).
jq -r --arg root "$PWD/" 'select(.reason == "compiler-artifact" and .profile.test and .executable != null)
       | (.manifest_path | sub("/Cargo.toml$"; "")) as $dir
       | [.executable, (($dir | ltrimstr($root)) + " " + .target.kind[0] + ":" + .target.name), $dir]
       | @tsv' "$out/build.json" | sort -u \
  | awk -F'\t' -v OFS='\t' '{ n[$2]++; if (n[$2] > 1) $2 = $2 " (" n[$2] ")"; print }' \
  | awk -F'\t' -v re="$only" 're == "" || $2 ~ re' >"$out/binaries.tsv"
[ -s "$out/binaries.tsv" ] || { echo "run-tests.sh: no test binary was built${only:+ whose name matches '$only'}" >&2; exit 101; }

# Longest first: the last run's seconds (this machine's, else the ones
# measured for the repository, test/tools/test-times.tsv), or "not timed
# yet" first of all.
[ -f "$times" ] || cp test/tools/test-times.tsv "$times"
awk -F'\t' -v times="$times" '
    BEGIN { while ((getline line < times) > 0) { split(line, a, "\t"); t[a[1]] = a[2] } }
    { print (($2 in t) ? t[$2] : 1e9) "\t" $0 }' "$out/binaries.tsv" \
  | sort -t$'\t' -k1,1 -gr >"$out/queue.tsv"
total=$(wc -l <"$out/queue.tsv")
echo "run-tests.sh: $total test binaries, $jobs at a time"

# run_one INDEX EXE NAME DIR: runs one binary, its output to a file, and its
# exit code and wall seconds beside it.
run_one() {
  local i=$1 exe=$2 name=$3 dir=$4 t0 rc
  t0=$(date +%s.%N)
  (cd "$dir" && RUSTC_BOOTSTRAP=1 "$exe" -Z unstable-options --report-time) >"$out/$i.log" 2>&1
  rc=$?
  awk -v a="$t0" -v b="$(date +%s.%N)" -v n="$name" -v r="$rc" 'BEGIN { printf "%s\t%s\t%.1f\n", n, r, b - a }' >"$out/$i.done"
}

declare -A running=()
printed=0
start=$(date +%s)
i=0
# Prints the output of every binary that ended, in the order they ended.
reap() {
  local f pid name rc secs
  for pid in "${!running[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid" 2>/dev/null
    f=${running[$pid]}
    unset "running[$pid]"
    IFS=$'\t' read -r name rc secs <"$out/$f.done"
    printed=$((printed + 1))
    echo
    echo "======== [$printed/$total] $name: exit $rc after ${secs}s ========"
    cat "$out/$f.log"
  done
}
# A binary named by $alone runs with nothing beside it: those run first,
# one after another, then the others fill the places, longest first.
queue=()
while IFS= read -r line; do
  IFS=$'\t' read -r _ _ name _ <<<"$line"
  [ -n "$alone" ] && [[ $name =~ $alone ]] && queue+=("$line")
done <"$out/queue.tsv"
while IFS= read -r line; do
  IFS=$'\t' read -r _ _ name _ <<<"$line"
  [ -n "$alone" ] && [[ $name =~ $alone ]] || queue+=("$line")
done <"$out/queue.tsv"
alone_pid=
while [ "${#queue[@]}" -gt 0 ]; do
  reap
  [ -n "$alone_pid" ] && [ -z "${running[$alone_pid]:-}" ] && alone_pid=
  if [ -n "$alone_pid" ] || [ "${#running[@]}" -ge "$jobs" ]; then sleep 0.5; continue; fi
  IFS=$'\t' read -r secs exe name dir <<<"${queue[0]}"
  is_alone=
  if [ -n "$alone" ] && [[ $name =~ $alone ]]; then
    is_alone=1
    # Its turn: it waits for the running ones to end.
    if [ "${#running[@]}" -gt 0 ]; then sleep 0.5; continue; fi
  fi
  queue=("${queue[@]:1}")
  i=$((i + 1))
  run_one "$i" "$exe" "$name" "$dir" &
  running[$!]=$i
  [ -n "$is_alone" ] && alone_pid=$!
done
while [ "${#running[@]}" -gt 0 ]; do reap; sleep 0.5; done

# The summary: libtest's own counts, per binary and in all.
passed=0 failed=0 ignored=0 broken=0
: >"$out/table.tsv"
for d in "$out"/*.done; do
  n=${d%.done}
  IFS=$'\t' read -r name rc secs <"$d"
  read -r p f ig < <(awk '/^test result:/ {
      for (k = 1; k <= NF; k++) { if ($(k+1) ~ /^passed/) p += $k; if ($(k+1) ~ /^failed/) f += $k; if ($(k+1) ~ /^ignored/) i += $k }
    } END { print p + 0, f + 0, i + 0 }' "$n.log")
  # A binary that failed without a result line (a crash, a signal) counts
  # as one failure, so that the closing line cannot say 0 failed.
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; broken=$((broken + 1)); fi
  passed=$((passed + p)); failed=$((failed + f)); ignored=$((ignored + ig))
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$secs" "$name" "$p" "$f" "$ig" "$rc" >>"$out/table.tsv"
done
# Kept for the next run's order: these binaries' times, and the others' as
# they were.
awk -F'\t' -v times="$times" '
    { t[$2] = $1 }
    END {
      while ((getline line < times) > 0) { split(line, a, "\t"); if (!(a[1] in t)) print line }
      for (n in t) print n "\t" t[n]
    }' "$out/table.tsv" >"$out/times.tsv"
mv "$out/times.tsv" "$times"

echo
echo "run-tests.sh: the test binaries by wall time (seconds; $jobs at a time)"
printf '%8s  %-48s %7s %7s %8s\n' seconds binary passed failed ignored
sort -t$'\t' -k1,1 -gr "$out/table.tsv" | while IFS=$'\t' read -r secs name p f ig rc; do
  printf '%8s  %-48s %7s %7s %8s%s\n' "$secs" "$name" "$p" "$f" "$ig" "$([ "$rc" -ne 0 ] && echo "  exit $rc")"
done
echo
echo "run-tests.sh: the ten slowest tests (seconds, libtest's --report-time)"
for d in "$out"/*.done; do
  n=${d%.done}
  IFS=$'\t' read -r name _ _ <"$d"
  awk -v n="$name" 'match($0, /^test .* \.\.\. [a-zA-Z]+ <[0-9.]+s>$/) {
      t = $0; sub(/^test /, "", t); sub(/ \.\.\. [a-zA-Z]+ <[0-9.]+s>$/, "", t)
      s = $NF; gsub(/[<>s]/, "", s); print s "\t" n "\t" t }' "$n.log"
done | sort -t$'\t' -k1,1 -gr | head -10 | while IFS=$'\t' read -r secs name test; do
  printf '%8s  %s  %s\n' "$secs" "$name" "$test"
done
if [ -s "$ARGOCD_PULL_NOT_RUN" ]; then
  echo
  echo "run-tests.sh: checks that did not run on this machine:"
  sort -u "$ARGOCD_PULL_NOT_RUN"
fi
echo
echo "run-tests.sh: wall time $(($(date +%s) - start))s; $ignored ignored$([ "$broken" -gt 0 ] && echo "; $broken binaries ended without a result line")"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

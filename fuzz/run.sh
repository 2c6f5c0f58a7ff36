#!/usr/bin/env bash
# Fuzzes every target (or the ones named) for MINUTES each, one after the other, and prints per
# target: executions per second, libFuzzer's final coverage (cov: edges, ft: features), and the
# crashes it found. docs/fuzzing.md says how to read and use the results.
#
#   fuzz/run.sh MINUTES [TARGET...]
#
# * Installs what it needs: the nightly toolchain (rustup) and cargo-fuzz 0.13.2 (cargo install --locked --debug).
# * libFuzzer's working corpus is fuzz/work/<target>/ (seeded from fuzz/corpus/<target>/, which
#   it only reads); crashes are saved in fuzz/artifacts/<target>/ (crash-*, timeout-*, oom-*).
#   libFuzzer stops at a crash: the run goes on with the time left, up to 20 crashes a target.
# * Logs: fuzz/logs/<target>.log; one line per run appended to fuzz/logs/runs.tsv.
# * SANITIZER=address runs under ASan (default: none — the code is safe Rust apart from two
#   UTF-8 reads in guest/src/name.rs, and ASan costs half the executions). One target at a
#   time, one process: the machine is shared.
set -euo pipefail

MINUTES=${1:?usage: fuzz/run.sh MINUTES [TARGET...]}
shift || true
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
if [ $# -gt 0 ]; then
  TARGETS=("$@")
else
  TARGETS=()
  for f in fuzz_targets/*.rs; do TARGETS+=("$(basename "$f" .rs)"); done
fi
SANITIZER=${SANITIZER:-none}

# What the run needs.
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
# cargo-fuzz pinned, and built without optimisation: it only starts cargo and the target, and
# an unoptimised build takes half the time of a release one (docs/fuzzing.md).
if ! cargo +nightly fuzz --version > /dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked --debug
fi
# The guest component clb-sandbox embeds is built with the pinned toolchain, not nightly.
CLB_GUEST_TOOLCHAIN=$(sed -n 's/^channel = "\(.*\)"/\1/p' ../rust-toolchain.toml)
export CLB_GUEST_TOOLCHAIN

# Only the targets asked for. Each build compiles this checkout's crates with coverage and the
# dependencies without (.cargo/config.toml, rustc-wrapper.sh).
for target in "${TARGETS[@]}"; do
  cargo +nightly fuzz build -s "$SANITIZER" "$target"
done

mkdir -p logs
# CPU time of the finished children of this shell (fields 16 and 17 of /proc/self/stat: cutime,
# cstime), in seconds: what a target's fuzzing cost, whatever else the machine was doing.
tck=$(getconf CLK_TCK)
children_cpu() { awk -v t="$tck" '{ print int(($16 + $17) / t) }' /proc/$$/stat; }
printf '%-14s %8s %8s %10s %9s %8s %8s %7s\n' target minutes cpu-min execs exec/s cov ft crashes
for target in "${TARGETS[@]}"; do
  mkdir -p "work/$target" "artifacts/$target"
  log="logs/$target.log"
  : > "$log"
  # Built before the clock starts (a no-op unless a source changed since the build above).
  cargo +nightly fuzz build -s "$SANITIZER" "$target" > /dev/null 2>&1
  left=$((MINUTES * 60))
  execs=0 crashes=0 cov=0 ft=0 runs=0 fuzzed=0
  start=$(date +%s)
  cpu0=$(children_cpu)
  while [ "$left" -gt 0 ] && [ "$crashes" -lt 20 ]; do
    runs=$((runs + 1))
    run_start=$(date +%s)
    out=$(mktemp)
    cargo +nightly fuzz run -s "$SANITIZER" "$target" "work/$target" "corpus/$target" -- \
      -max_total_time="$left" -print_final_stats=1 -timeout=30 -rss_limit_mb=4096 -max_len=16384 \
      -artifact_prefix="artifacts/$target/" > "$out" 2>&1 || true
    cat "$out" >> "$log"
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -1)
    execs=$((execs + ${n:-0}))
    # libFuzzer's own seconds when it says them; a run that ended in a crash does not, so its
    # wall time counts instead.
    t=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$out" | tail -1)
    fuzzed=$((fuzzed + ${t:-$(($(date +%s) - run_start))}))
    last=$(grep -E 'cov: [0-9]+' "$out" | tail -1 || true)
    c=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<< "$last")
    f=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<< "$last")
    [ -n "$c" ] && [ "$c" -gt "$cov" ] && cov=$c
    [ -n "$f" ] && [ "$f" -gt "$ft" ] && ft=$f
    if grep -q 'Test unit written to' "$out"; then
      crashes=$((crashes + $(grep -c 'Test unit written to' "$out")))
      grep 'Test unit written to' "$out" | sed "s/^/  $target: /"
    elif ! grep -q 'stat::number_of_executed_units' "$out"; then
      echo "  $target: the run ended without stats (see $log)"
      rm -f "$out"
      break
    fi
    rm -f "$out"
    left=$((MINUTES * 60 - ($(date +%s) - start)))
  done
  secs=$(( $(date +%s) - start ))
  cpu=$(( $(children_cpu) - cpu0 ))
  # Executions per second of fuzzing (libFuzzer's own seconds, restarts after a crash excluded).
  rate=$(( execs / (fuzzed > 0 ? fuzzed : (secs > 0 ? secs : 1)) ))
  printf '%-14s %8s %8s %10s %9s %8s %8s %7s\n' "$target" "$MINUTES" "$((cpu / 60))" "$execs" "$rate" \
    "$cov" "$ft" "$crashes"
  # Columns: end time, target, minutes asked, wall seconds, executions, exec/s, cov, ft, crashes,
  # CPU seconds.
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$target" "$MINUTES" "$secs" \
    "$execs" "$rate" "$cov" "$ft" "$crashes" "$cpu" >> logs/runs.tsv
done

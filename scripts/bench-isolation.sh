#!/usr/bin/env bash
# What gVisor costs against runc, measured in the same run through the
# corral CLI: a sandbox's cold start (create, start, one command, remove),
# a CPU-bound command, and a syscall-heavy one (`find /` over the whole
# image, stat-ing every file). Prints each row's median in ms under both
# tiers and the ratio gvisor/container; the workload rows are net of the
# cold start measured in the same run. Needs runsc registered
# (scripts/ensure-gvisor.sh) and the test images. Usage:
#   scripts/bench-isolation.sh [ROUNDS]   (default 7)
set -euo pipefail
rounds=${1:-7}
here=$(cd "$(dirname "$0")/.." && pwd)
corral=${CORRAL_BIN:-$here/target/debug/corral}
image=${CORRAL_BENCH_IMAGE:-corral-test/busybox}

ms() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# One row: the median wall time in ms of `corral run` of SCRIPT under ISOLATION.
row() {
  local isolation=$1 script=$2
  for _ in $(seq "$rounds"); do
    local t0 t1
    t0=$(ms)
    "$corral" run --image "$image" --isolation "$isolation" -- sh -c "$script" >/dev/null
    t1=$(ms)
    echo $(((t1 - t0) / 1000000))
  done | median
}

printf '%-14s %10s %10s %7s\n' row container gvisor ratio
for spec in \
  "cold-start|true" \
  "cpu-bound|i=0; while [ \$i -lt 300000 ]; do i=\$((i+1)); done" \
  "syscall-heavy|for i in 1 2 3 4 5; do find / -xdev >/dev/null 2>&1; done"; do
  name=${spec%%|*}
  script=${spec#*|}
  c=$(row container "$script")
  g=$(row gvisor "$script")
  if [ "$name" = cold-start ]; then
    cold_c=$c
    cold_g=$g
  else
    c=$((c - cold_c))
    g=$((g - cold_g))
  fi
  printf '%-14s %10s %10s %7.2f\n' "$name" "$c" "$g" "$(echo "$g / $c" | bc -l)"
done

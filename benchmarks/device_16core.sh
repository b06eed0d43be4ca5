#!/bin/bash
# The accuracy benchmark on the 16-core GPU machine's CPUs (gloo, dedicated cores), as the
# `device` tool runs it: one command, every result written under $OUT as it is made, so a
# command cut off at its limit keeps the launches it finished.
#
#   SEED=2055 P2_MODELS=6 P4_MODELS=4 P8_MODELS=3 bash benchmarks/device_16core.sh
#   SEED=2071 P2_THREADS="share 7 1" P4_THREADS="share 3 1" P8_MODELS=0 bash benchmarks/device_16core.sh
#
# P2_THREADS etc.: one launch series per entry, each with PIPESCHED_THREADS_PER_RANK set to
# it ("share": unset, the rank's whole share of the cores); files named ..._t<entry>.
#
# Needs: the simpy wheel in .whl/ (that image has no simpy and no network), python3 with torch.
# The package is made importable as pipesched.* by links inside this copy of the tree (the
# install's package-dir mapping), so nothing is installed there. Also records what the
# machine is (lscpu, its load, steal time before and after), since the 16-core runs of
# 2026-11-26 spread 12-18 % and nobody read whether the VM's CPUs were stolen.
set -u
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
SEED=${SEED:-2055}
log="$OUT/log.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# only where pipesched.* is not importable already (an installed checkout needs no links)
if ! python3 -c "import pipesched.simulator" 2>/dev/null; then
  for sub in schedules simulator executor; do ln -sfn "../$sub" "pipesched/$sub"; done
fi

machine() {
  echo "== $1 $(date -u +%T)"
  uptime
  head -1 /proc/stat   # user nice system idle iowait irq softirq steal ...
}
{
  machine start
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L2|L3'
  python3 -c "import torch; print('torch', torch.__version__)"
  ps -eo pcpu,comm --sort=-pcpu | head -8
} >"$OUT/machine.txt" 2>&1

bench() {  # name, threads ("share" or a number), time limit in seconds, then the benchmark's own arguments
  local name=$1 threads=$2 limit=$3; shift 3
  [ "$threads" = share ] || name="${name}_t$threads"
  echo "== $name ($(date -u +%T))" >>"$log"
  if [ "$threads" = share ]; then unset PIPESCHED_THREADS_PER_RANK; else export PIPESCHED_THREADS_PER_RANK=$threads; fi
  timeout -k 10 "$limit" python3 benchmarks/accuracy_random.py --seed "$SEED" --draw-ranks 2,4,8 \
    --save-runs "$OUT/${name}_runs.json.gz" "$@" >>"$log" 2>&1
  echo "== $name exit $? ($(date -u +%T))" >>"$log"
  machine "after $name" >>"$OUT/machine.txt"
}
for p in 2 4 8; do
  models_var="P${p}_MODELS" limit_var="P${p}_LIMIT" threads_var="P${p}_THREADS"
  default_models=$(( p == 2 ? 6 : (p == 4 ? 4 : 3) )) default_limit=$(( p == 2 ? 170 : (p == 4 ? 150 : 220) ))
  [ "${!models_var:-$default_models}" -gt 0 ] || continue
  for threads in ${!threads_var:-share}; do
    bench "p$p" "$threads" "${!limit_var:-$default_limit}" --ranks "$p" --models "${!models_var:-$default_models}"
  done
done
ls -la "$OUT" >>"$log"

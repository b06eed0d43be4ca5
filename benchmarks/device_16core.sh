#!/bin/bash
# The accuracy benchmark on the 16-core GPU machine's CPUs (gloo, dedicated cores), as the
# `device` tool runs it: one command, every result written under $OUT as it is made, so a
# command cut off at its limit keeps the launches it finished.
#
#   SEED=2055 P2_MODELS=6 P4_MODELS=4 P8_MODELS=3 bash benchmarks/device_16core.sh
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

bench() {  # name, time limit in seconds, then the benchmark's own arguments
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%T))" >>"$log"
  timeout -k 10 "$limit" python3 benchmarks/accuracy_random.py --seed "$SEED" --draw-ranks 2,4,8 \
    --save-runs "$OUT/${name}_runs.json.gz" "$@" >>"$log" 2>&1
  echo "== $name exit $? ($(date -u +%T))" >>"$log"
  machine "after $name" >>"$OUT/machine.txt"
}
bench p2 "${P2_LIMIT:-170}" --ranks 2 --models "${P2_MODELS:-6}"
bench p4 "${P4_LIMIT:-150}" --ranks 4 --models "${P4_MODELS:-4}"
bench p8 "${P8_LIMIT:-220}" --ranks 8 --models "${P8_MODELS:-3}"
ls -la "$OUT" >>"$log"

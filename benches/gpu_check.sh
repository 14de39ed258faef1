#!/usr/bin/env bash
# The one prepared device script of issue 9: correctness of the Triton path against the torch path
# on the GPU, then the whole benchmark suite, in well under 10 minutes on one H200.
#
# Before the call, on the workstation (pip works there, not on the device machine):
#     bash benches/fetch_gpu_wheels.sh          # outlines-core for the device's Python 3.12 -> .whl/
# Then, through the device tool:
#     run(command="bash benches/gpu_check.sh", carry=[".whl"], timeout_s=480)
# Results come back under $OUT (check.json, the suite's JSON and plot, the log); copy them into
# benches/results/ and commit them. Nothing here changes the GPU's settings.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${OUT:-$PWD/benches/results}"
mkdir -p "$OUT"
PY=python3
START=$(date +%s)

# Packages the device image lacks (outlines-core: regex-constrained decoding), carried as wheels.
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site" || echo "WARNING: wheel install failed; the JSON workload may be skipped"
fi
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm --format=csv 2>&1 | tee "$OUT/gpu.txt"
$PY -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"

echo "== 1/2 correctness: Triton vs torch on the GPU =="
# 240 s: a fresh device has no Triton cache and compiles about 50 kernel variants before the checks
timeout 240 $PY benches/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/check.log"
CHECK=${PIPESTATUS[0]}
[ "$CHECK" -eq 0 ] || echo "!! correctness check FAILED (exit $CHECK): the suite below still runs, but its numbers are suspect"

ELAPSED=$(( $(date +%s) - START ))
BUDGET=$(( 380 - ELAPSED ))   # the whole script in about 6.5 minutes: time to rerun it in a 15-minute lease
echo "== 2/2 benchmark suite (budget ${BUDGET} s) =="
timeout -k 15 $(( BUDGET + 30 )) $PY benches/gpu_suite.py --budget-s "$BUDGET" --out-dir "$OUT" 2>&1 | tee "$OUT/suite.log"
SUITE=${PIPESTATUS[0]}
echo "gpu_check.sh: correctness exit $CHECK, suite exit $SUITE, total $(( $(date +%s) - START )) s"

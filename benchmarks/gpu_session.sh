#!/usr/bin/env bash
# The GPU checks in one run on a CUDA machine whose python3 already has torch, triton, pytest and hypothesis:
#   1. the library's tests on CUDA (the fused kernel compiled, the propositions with CUDA parametrisations);
#   2. the fused kernel's benchmark (resumable: rerun to finish the grid), wide logits too;
#   3. Fig. 3 in GPU seconds.
# Results go to $OUT (or benchmarks/results); copy the CSVs into benchmarks/results/ and commit them.
#   bash benchmarks/gpu_session.sh [seconds for the kernel grid, default 240]
# pytopk (pure Python) can be put on PYTHONPATH beforehand for the comparison; without it, that column is skipped.
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider topk/tests 2>&1 | tee "$out/cuda_tests.log" || status=1
for grid in headline issue; do
  timeout "${1:-240}" python3 benchmarks/bench_fused_kernel.py --device cuda --grid "$grid" \
    --out "$out/fused_kernel.csv" 2>&1 | tee -a "$out/fused_kernel.log"
done
timeout 60 python3 benchmarks/bench_fused_kernel.py --device cuda --grid headline --logit-scale 20 \
  --out "$out/fused_kernel.csv" 2>&1 | tee -a "$out/fused_kernel.log"
timeout 240 python3 benchmarks/bench_epoch_time.py --device cuda --out "$out/fig3_epoch_time.csv" 2>&1 \
  | tee "$out/fig3_epoch_time.log" || status=1
exit $status

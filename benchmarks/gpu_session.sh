#!/usr/bin/env bash
# The GPU checks on a CUDA machine whose python3 already has torch, triton, pytest, pytest-xdist and hypothesis, one
# stage per call (each fits in a 10-minute device call), in order of priority:
#   tests   the library's tests on CUDA: the kernel compiled, sync debug mode, CUDA-graph replays, reduce-overhead steps;
#           then the training engine's on CUDA (autocast, siblings, a killed run resumed to the same result), then
#           the README's and docs' examples (their compiled CUDA-graph training step)
#   step    benchmarks.bench_training_step: ms per DenseNet-40-40 step, eager and compiled (or the modes given after
#           the stage), overheads over CE
#   kernel  the fused kernel's grids with their memory and noise floors, every kind of input (resumable: rerun to
#           finish); the headline and the issue's grid, or the grids named after the time limit
#   fig3    Fig. 3 in GPU seconds (the second argument: torch.compile's mode for the engine's step, "default" unless
#           given; the third and later: the K values, the paper's grid unless given; 7 points a K, about 25 s each;
#           FIG3_RESUME=PATH starts from the rows of an earlier call's CSV, whose points are then skipped)
#   hinge   the smoothed hinge on CUDA, tree against Triton kernel, against CE (headline, then the grid until the limit)
#   profile the gpu profile's hours on this GPU (benchmarks.bench_profile_time: each setup's images/s times its
#           workload)
#   host    an eager step's host time: through the custom operators against direct calls (benchmarks.bench_dispatch),
#           and each loss's step, enqueue and kernel times with the profiler's table (benchmarks.profile_loss_overhead)
#   concurrency  1, 2, 4 and 8 compiled DenseNet-40-40 trainings side by side on the GPU: aggregate images/s, memory,
#           warm-up (compilation) seconds, validation images/s, the gpu profile's estimated hours on one GPU and
#           on eight (benchmarks.bench_concurrency; the second argument: torch.compile's mode,
#           "default" unless given, e.g. reduce-overhead for CUDA graphs; the third and later: the counts)
#   concurrency-mps  the concurrency stage under NVIDIA's Multi-Process Service (started and stopped around it)
#   stacked one run alone, then 2, 4 and 8 runs stacked into one model in one process (bench_concurrency --stack:
#           grouped convolutions; the second argument: torch.compile's mode, "default" unless given; the third and
#           later: the stack sizes). CUDNN_BENCHMARK=1 lets cuDNN time its algorithms first in this stage and in
#           concurrency's (the rows say so); STEPS=N times N steps a run instead of 200 in both
#   step-profile  where the engine's DenseNet-40-40 step spends the device's time, compiled with reduce-overhead
#           then default (or the modes given after the stage): kernels a step, their summed time against the step's, the share in short kernels, the
#           heaviest kernels (benchmarks.profile_training_step)
#   streams 1, 2, 4 and 8 compiled DenseNet-40-40 trainings as threads of one process, each on its own CUDA stream:
#           MPS's overlap without its daemon (benchmarks.bench_streams; the second argument: torch.compile's mode,
#           "reduce-overhead" unless given; the third and later: the counts)
#   lease   the next lease's checks in one call that ends inside ten minutes: tests (251 s in NOTES section 27: the
#           library's, then the engine's and the examples', which compile; with the thread test whose crash section
#           27 fixed), then 1, 2 and 4 runs as threads on their own streams (section 27's two threads failed in a
#           graph capture), then Fig. 3 over the paper's K with reduce-overhead (seven points a K, about 25 s each;
#           FIG3_RESUME=PATH, a fig3_epoch_time.csv an earlier call returned, skips the points it holds), every
#           stage under its own limit (LEASE_LIMITS="tests streams fig3" seconds, default "265 100 195": 560 s, with
#           the stages' grace inside a 600 s call); wheels in .whl/ installed first; everything in one archive,
#           $OUT/lease.tgz (a device machine returns few files), written again after each stage, and each stage's end
# Results go to $OUT (or benchmarks/results); copy the CSVs and logs into benchmarks/results/ and commit them.
# Run from the repository root (each benchmark runs as python3 -m benchmarks.NAME):
#   bash benchmarks/gpu_session.sh STAGE [seconds for each kernel grid, default 240] [kernel grids, default
#   "headline issue"]
# pytopk (pure Python) can be put on PYTHONPATH beforehand for the kernel comparison and the tests that compare with
# it; without it, that column and those tests are skipped. The engine's tests need latex2mathml too (both travel as
# wheels, both pure Python, where the GPU machine has no package index).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
# the tree that runs: a device machine may lay it over an older commit, whose stamp then reads -dirty
{ git rev-parse HEAD; git diff HEAD --stat; } >> "$out/gpu.txt" 2>&1
mps_running() {  # an MPS control daemon or server among the processes (a name is cut at 15 characters)
  grep -qsx "nvidia-cuda-mps" /proc/[0-9]*/comm
}
stop_mps() {  # ask the daemon to quit, then wait (at most 20 s) until no MPS process is left
  echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
  for _ in $(seq 20); do mps_running || return 0; sleep 1; done
  echo "MPS processes still running after 20 s" >&2; return 1
}
case "${1:-tests}" in
  tests)
    python3 -m pytest -n "${PYTEST_WORKERS:-14}" -q -rs -p no:cacheprovider topk/tests 2>&1 | tee "$out/cuda_tests.log" || status=1
    CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 -m pytest -q -p no:cacheprovider experiments/tests/test_experiments.py \
      -k cuda 2>&1 | tee "$out/cuda_engine_tests.log" || status=1
    python3 -m pytest -q -p no:cacheprovider experiments/tests/test_readme.py -k examples 2>&1 \
      | tee "$out/readme_examples.log" || status=1 ;;
  step)
    modes="${*:2}"
    python3 -m benchmarks.bench_training_step --device cuda ${modes:+--modes $modes} --out "$out/training_step.csv" 2>&1 \
      | tee "$out/training_step.log" || status=1 ;;
  kernel)
    for grid in ${3:-headline issue}; do
      timeout "${2:-240}" python3 -m benchmarks.bench_fused_kernel --device cuda --grid "$grid" \
        --out "$out/fused_kernel.csv" 2>&1 | tee -a "$out/fused_kernel.log"
    done ;;
  fig3)
    ks="${*:3}"
    if [ -n "${FIG3_RESUME:-}" ]; then cp "$FIG3_RESUME" "$out/fig3_epoch_time.csv" || exit 2; fi
    python3 -m benchmarks.bench_epoch_time --device cuda --compile "${2:-default}" ${ks:+--ks $ks} \
      --out "$out/fig3_epoch_time.csv" 2>&1 \
      | tee "$out/fig3_epoch_time.log" || status=1 ;;
  hinge)
    python3 -m benchmarks.bench_smooth_hinge --device cuda --headline --out "$out/smooth_hinge_cuda_headline.csv" 2>&1 \
      | tee "$out/smooth_hinge_cuda.log" || status=1
    timeout "${2:-300}" python3 -m benchmarks.bench_smooth_hinge --device cuda --out "$out/smooth_hinge_cuda.csv" 2>&1 \
      | tee -a "$out/smooth_hinge_cuda.log" ;;
  profile)
    python3 -m benchmarks.bench_profile_time gpu --device cuda --out "$out/profile_time_gpu_cuda.csv" 2>&1 \
      | tee "$out/profile_time_gpu_cuda.log" || status=1 ;;
  host)
    python3 -m benchmarks.bench_dispatch --device cuda 2>&1 | tee "$out/dispatch_cuda.log" || status=1
    for size in 1000 100000; do
      python3 -m benchmarks.profile_loss_overhead --batch 256 --classes $size \
        > "$out/profile_overhead_256x$size.txt" 2>&1 || status=1
    done
    grep -h "^==" "$out"/profile_overhead_*.txt ;;
  step-profile)
    modes="${*:2}"
    for mode in ${modes:-reduce-overhead default}; do
      python3 -m benchmarks.profile_training_step --device cuda --compile-mode $mode --out "$out/step_profile.csv" \
        2>&1 | tee -a "$out/step_profile.log" || status=1
    done ;;
  concurrency)
    counts="${*:3}"
    python3 -m benchmarks.bench_concurrency --device cuda --model densenet40_40 --concurrency ${counts:-1 2 4 8} \
      --compile-mode "${2:-default}" ${CUDNN_BENCHMARK:+--cudnn-benchmark} ${STEPS:+--steps $STEPS} \
      --out "$out/concurrency.csv" 2>&1 | tee -a "$out/concurrency.log" || status=1 ;;
  stacked)
    stacks="${*:3}"
    python3 -m benchmarks.bench_concurrency --device cuda --model densenet40_40 --concurrency 1 --stack ${stacks:-2 4 8} \
      --compile-mode "${2:-default}" ${CUDNN_BENCHMARK:+--cudnn-benchmark} ${STEPS:+--steps $STEPS} \
      --out "$out/concurrency.csv" 2>&1 | tee -a "$out/stacked.log" || status=1 ;;
  streams)
    counts="${*:3}"
    python3 -m benchmarks.bench_streams --device cuda --model densenet40_40 --threads ${counts:-1 2 4 8} \
      --compile-mode "${2:-reduce-overhead}" ${STEPS:+--steps $STEPS} \
      --out "$out/streams.csv" 2>&1 | tee -a "$out/streams.log" || status=1 ;;
  concurrency-mps)
    # the concurrency stage with NVIDIA's Multi-Process Service: kernels of runs side by side execute at once instead
    # of taking turns (root starts the daemon; the rows say gpu_sharing=mps)
    command -v nvidia-cuda-mps-control > /dev/null || { echo "no nvidia-cuda-mps-control here" >&2; exit 3; }
    if ! mps_running; then
      nvidia-cuda-mps-control -d || { echo "the MPS daemon did not start" >&2; exit 3; }
      trap stop_mps EXIT
    fi
    bash "$0" concurrency "${@:2}" || status=1 ;;
  lease)
    if compgen -G ".whl/*.whl" > /dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
    fi
    read -r tests_s streams_s fig3_s <<< "${LEASE_LIMITS:-}"
    tests_s=${tests_s:-265} streams_s=${streams_s:-100} fig3_s=${fig3_s:-195}
    work=$(mktemp -d)
    while read -r limit name stage mode ks; do
      start=$SECONDS
      OUT="$work/$name" timeout -k 5 "$limit" bash "$0" "$stage" $mode $ks > "$work/$name.log" 2>&1 < /dev/null
      rc=$?
      if [ "$stage" = concurrency-mps ] && mps_running; then  # cut short before its own stop
        stop_mps 2>&1 | tee -a "$work/lease.txt"
      fi
      [ $rc -eq 0 ] || status=1
      echo "$name: rc $rc in $((SECONDS - start)) s (limit $limit)" | tee -a "$work/lease.txt"
      tar czf "$out/lease.tgz" -C "$work" .  # what finished survives a call cut short
    done <<EOF
$tests_s tests tests
$streams_s streams_reduce_overhead streams reduce-overhead 1 2 4
$fig3_s fig3_reduce_overhead fig3 reduce-overhead
EOF
    for log in "$work"/*.log; do echo "== $(basename "$log")"; tail -n 6 "$log"; done
    cat "$work/lease.txt" ;;
  *)
    echo "unknown stage ${1}: tests, step, kernel, fig3, hinge, profile, host, concurrency, concurrency-mps, stacked, streams, step-profile or lease" >&2; status=2 ;;
esac
exit $status

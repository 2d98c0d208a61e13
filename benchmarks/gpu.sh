#!/usr/bin/env bash
# Everything the device machine runs for the PyTorch runtime, in one call:
#   uv build --all-packages && git describe --always --dirty > dist/COMMIT   (here), then
#   through the device tool:
#   bash benchmarks/gpu.sh    (there; needs dist/ carried)
#   bash benchmarks/gpu.sh --flashinfer   (also needs .whl/ carried: flashinfer-python,
#                                          apache-tvm-ffi; see benchmarks/gpu_flashinfer.py)
#   bash benchmarks/gpu.sh --gpu-tests   (both runtimes' and the plugins' gpu-marked tests; .whl/ and .whl-test/
#                                          carried, the latter with pytest's wheels)
#   bash benchmarks/gpu.sh --steps [--parts t,s --models ...]   (.whl/ with nvmath-python too;
#                                          whole steps with both plugins: gpu_steps.py)
#   bash benchmarks/gpu.sh --generate [--models ...]   (.whl/ as for --steps; Model.generate vs
#                                          the captured step it runs: gpu_generate.py)
#   bash benchmarks/gpu.sh --paged [--batches 8,32,64]   (.whl/ as for --steps; dense vs paged
#                                          KV cache decode steps of the 8B shape: gpu_paged.py)
#   bash benchmarks/gpu.sh --quant [--models ... --batches 1,8,32 --profile]   (.whl/ as for
#                                          --steps; bf16 vs int8 vs int4 decode steps: gpu_quant.py)
#   bash benchmarks/gpu.sh --quant-batched [--rows 8,32]   (batched int4 tile designs vs bf16
#                                          cuBLAS: quant_batched.py)
#   bash benchmarks/gpu.sh --start [--models ...]   (.whl/ as for --steps; load -> first planned
#                                          token, cold and warm $LINNET_HOME: gpu_start.py)
#   bash benchmarks/gpu.sh --kernels [--runs N]   (every std kernel launched for real against
#                                          its body, timed, floors, graph breaks: kernels.py)
#   bash benchmarks/gpu.sh --tp [tp_decode.py's options]   (several GPUs: TP 1, 2, 4 decode)
#   bash benchmarks/gpu.sh --decode-kernels [--shapes 8b,1b --sweep BO:BK,...]   (std.nn.decode's
#                                          span kernels at decode shapes: decode_kernels.py)
#   bash benchmarks/gpu.sh --moe [--layers 8]   (a Mixtral-shaped stack vs transformers, and the
#                                          decode chain's bytes: gpu_moe.py, moe_bytes.py)
#   bash benchmarks/gpu.sh --pallas [--runs N]   (linnet-runtime-jax's gpu-marked Pallas tests,
#                                          then every std kernel launched through Pallas from
#                                          generated JAX against its body, timed: pallas.py)
# Results land in $OUT (or ./gpu-results) and the summary tables are printed last.
set -uo pipefail
OUT=${OUT:-gpu-results}
mkdir -p "$OUT" /tmp/site
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site dist/*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} LINNET_HOME=/tmp/linnet-home PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
# The commit the carried wheels were built from: dist/COMMIT where the build wrote it (the
# device's copy of .git can name an older HEAD than the working tree it carries).
{ cat dist/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null; } | tee -a "$OUT/gpu.txt"
[ "${1:-}" = "--cublaslt" ] && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1; python3 benchmarks/gpu_cublaslt.py 2>&1 | tee "$OUT/cublaslt.log" | grep -v Warning | tail -70; exit 0; }
# Tensor parallelism (issue 21; a kind with 2+ GPUs): benchmarks/tp_decode.py, e.g.
#   bash benchmarks/gpu.sh --tp --config llama-3-8b --tp 1,2,4 --context 1024
[ "${1:-}" = "--tp" ] && { python3 benchmarks/tp_decode.py "${@:2}" 2>&1 | tee "$OUT/tp.log" | grep -v Warning | tail -12; exit 0; }
# Mixture of experts (issue 45): a Mixtral-shaped layer stack against transformers
# (benchmarks/gpu_moe.py), then the decode chain's bytes and timings (benchmarks/moe_bytes.py).
if [ "${1:-}" = "--moe" ]; then
  python3 benchmarks/gpu_moe.py "${@:2}" 2>&1 | tee "$OUT/moe.log" | grep -v Warning | tail -12
  python3 benchmarks/moe_bytes.py --device cuda 2>&1 | tee "$OUT/moe-bytes.log" | grep -v Warning | tail -16
  exit 0
fi
# linnet-runtime-jax's decode step (jax 0.11.2 is preinstalled there): benchmarks/jax_decode.py.
[ "${1:-}" = "--jax" ] && { python3 benchmarks/jax_decode.py "${@:2}" 2>&1 | tee "$OUT/jax.log" | grep -v Warning | tail -12; exit 0; }
if [ "${1:-}" = "--decode" ]; then
  LINNET_BENCH_QUICK=1 python3 benchmarks/gpu_plan.py 2>&1 | tee "$OUT/decode.log" | grep -v Warning | tail -14
  exit 0
fi
if [ "${1:-}" = "--plan" ]; then
  python3 benchmarks/gpu_plan.py 2>&1 | tee "$OUT/plan.log" | grep -v Warning | tail -24
  python3 benchmarks/torch_decode.py --config llama-3.2-1b --device cuda --context 64 --steps 8 \
      --modes generated --compile-layers 2,all 2>&1 | tee "$OUT/compile-time.log" | tail -5
  exit 0
fi
flashinfer_env() {
  # FlashInfer and apache-tvm-ffi (and nvmath-python) from carried wheels (.whl/).
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
  # FlashInfer's JIT links against libcuda.so; some images have only the driver's libcuda.so.1.
  if ! ldconfig -p | grep -q 'libcuda\.so '; then
    lib=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
    if [ -n "$lib" ]; then
      mkdir -p /tmp/libcuda && ln -sf "$lib" /tmp/libcuda/libcuda.so
      export LIBRARY_PATH=/tmp/libcuda${LIBRARY_PATH:+:$LIBRARY_PATH}
    fi
  fi
  python3 -m linnet.torch.flashinfer --warm --head-dims "${FLASHINFER_HEAD_DIMS:-64,128}" 2>&1 | tee "$OUT/flashinfer-warm.log"
}
if [ "${1:-}" = "--flashinfer" ]; then
  flashinfer_env
  python3 benchmarks/gpu_flashinfer.py "${@:2}" 2>&1 | tee "$OUT/flashinfer.log" | grep -v Warning | tail -40
  exit 0
fi
if [ "${1:-}" = "--gpu-tests" ]; then
  # The runtime's and the plugins' GPU-marked tests. The image has pytest and hypothesis;
  # .whl-test/ (pytest, pluggy and iniconfig wheels) is needed only where it has not.
  if ls .whl-test/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-test/*.whl || exit 1
  fi
  flashinfer_env
  export LINNET_GPU_TESTS=1
  # GPU_TEST_DIRS picks some of them (a run of all can pass one call's 10-minute limit).
  # An entry "dir:a.py,b.py" runs only those files of dir/tests; GPU_TEST_K, pytest's -k.
  for entry in ${GPU_TEST_DIRS:-packages/linnet-runtime-torch packages/linnet-runtime-jax \
      plugins/linnet-cublaslt plugins/linnet-flashinfer}; do
    dir=${entry%%:*}; files=tests
    [ "$entry" != "$dir" ] && files=$(echo "${entry#*:}" | tr ',' '\n' | sed 's|^|tests/|' | tr '\n' ' ')
    echo "== $entry"
    (cd "$dir" && python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors -m gpu -rfs ${GPU_TEST_K:+-k "$GPU_TEST_K"} $files 2>&1 | tee -a "$OUT/gpu-tests.log" | grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" | tail -25)
  done
  if [ -n "${GPU_STEPS_PARTS:-}" ]; then
    python3 benchmarks/gpu_steps.py --parts "$GPU_STEPS_PARTS" 2>&1 | tee "$OUT/steps.log" | grep -v Warning | tail -30
  fi
  exit 0
fi
if [ "${1:-}" = "--pallas" ]; then
  python3 -c "import jax; print('jax', jax.__version__, jax.default_backend())" | tee -a "$OUT/gpu.txt"
  (cd packages/linnet-runtime-jax && LINNET_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider \
      -m gpu tests/test_jax_pallas.py 2>&1 | tee "$OUT/pallas-tests.log" | tail -6)
  python3 benchmarks/pallas.py "${@:2}" 2>&1 | tee "$OUT/pallas.log" | grep -v Warning | tail -24
  exit 0
fi
if [ "${1:-}" = "--decode-kernels" ]; then
  python3 benchmarks/decode_kernels.py "${@:2}" 2>&1 | tee "$OUT/decode_kernels.log" | grep -v Warning | tail -60
  exit 0
fi
if [ "${1:-}" = "--kernels" ]; then
  python3 benchmarks/kernels.py "${@:2}" 2>&1 | tee "$OUT/kernels.log" | grep -v Warning | tail -40
  exit 0
fi
if [ "${1:-}" = "--start" ]; then
  # Start-up with a cold and a warm $LINNET_HOME (gpu_start.py); the plugins when .whl/ is here.
  if ls .whl/*.whl >/dev/null 2>&1; then flashinfer_env; fi
  python3 benchmarks/gpu_start.py "${@:2}" 2>&1 | tee "$OUT/start.log" | grep -v Warning | tail -40
  exit 0
fi
if [ "${1:-}" = "--generate" ]; then
  # Model.generate against the captured step it runs, new prompt lengths, text (gpu_generate.py).
  flashinfer_env
  python3 benchmarks/gpu_generate.py "${@:2}" 2>&1 | tee "$OUT/generate.log" | grep -v Warning | tail -40
  exit 0
fi
if [ "${1:-}" = "--paged" ]; then
  # Paged KV cache decode steps (issue 44): dense cache against pages, B 8/32/64 (gpu_paged.py).
  flashinfer_env
  # PYPROF=1: the whole run under cProfile, the statistics to $OUT/paged.prof (warm-up's cost).
  python3 ${PYPROF:+-m cProfile -o "$OUT/paged.prof"} benchmarks/gpu_paged.py "${@:2}" 2>&1 | tee "$OUT/paged.log" | grep -v Warning | tail -30
  exit 0
fi
if [ "${1:-}" = "--quant" ]; then
  # Quantised decode steps (issue 42): bf16 against int8 and int4, Captured (gpu_quant.py).
  flashinfer_env
  python3 benchmarks/gpu_quant.py "${@:2}" 2>&1 | tee "$OUT/quant.log" | grep -v Warning | tail -60
  exit 0
fi
if [ "${1:-}" = "--quant-batched" ]; then
  # Batched int4 products' tile designs against bf16 cuBLAS at 8 and 32 rows (quant_batched.py).
  python3 benchmarks/quant_batched.py "${@:2}" 2>&1 | tee "$OUT/quant-batched.log" | grep -v Warning | tail -130
  exit 0
fi
if [ "${1:-}" = "--steps" ]; then
  # Whole decode steps with both plugins, and FlashInfer token for token (gpu_steps.py).
  flashinfer_env
  # How large $LINNET_HOME (timings, compiled slices) grows, every minute: a call that runs
  # out of time keeps the last count (could a later call carry it back?).
  # (Its output goes nowhere else, and it stops with the script: an open pipe would hold the
  # caller's `| tail` until the call's limit.)
  ( while sleep 60; do du -sh "$LINNET_HOME" "$LINNET_HOME"/* "$LINNET_HOME"/cache/* \
      > "$OUT/home-size.txt" 2>/dev/null; done ) >/dev/null 2>&1 </dev/null &
  sizes=$!
  trap 'kill $sizes 2>/dev/null' EXIT
  python3 benchmarks/gpu_steps.py "${@:2}" 2>&1 | tee "$OUT/steps.log" | grep -v Warning | tail -60
  exit 0
fi
python3 benchmarks/gpu_parity.py 2>&1 | tee "$OUT/parity.log" | grep -v Warning | tail -12
python3 benchmarks/torch_decode.py --config llama-3.2-1b --device cuda --context 1024 --steps 64 \
    --modes hf,generated,compile --compile-layers 2,all --json "$OUT/decode-1b.json" 2>&1 \
    | tee "$OUT/decode-1b.log" | grep -v Warning | tail -22

#!/usr/bin/env bash
# The CUDA engine's one prepared device check (docs/benchmarks.md, "GPU check"): on a machine with
# one NVIDIA GPU (SM90 or SM100), the CUDA toolkit with NCCL and troupe's build dependencies
# (scripts/install-deps.sh), it
#   1. configures and builds the CUDA targets for this GPU's architecture only (build-gpu/),
#   2. runs the host-side planning tests (test_cuda_host) and the device tests (test_cuda:
#      each kernel against the CPU math, the NCCL communicator formed through the EP group's
#      unique-id message, the MoE layer at EP 2 on one GPU equal to EP 1 through NCCL,
#      cuda_backend stepping as cpu_backend, the forward pass of kernels/cuda/device_model.hpp against the
#      CPU engine on the golden models (sliding, mixed, qat, ratio4: window, CSA2 and Engram
#      layers) and the tiny preset: logits and 64 greedy tokens; batch-invariant mode; the
#      DSpark draft layers against the CPU engine's drafts; the
#      device port running cuda_backend as `troupe serve` runs a device = "cuda" rank: a CPU
#      device's greedy tokens, KV moved from a CPU device to the GPU and back),
#   3. runs the throughput benchmark (bench_cuda_kernels) and prints its table,
#   4. with --serve, also builds the troupe CLI and runs bench/serve_check.sh on
#      examples/topologies/local-cuda.toml: `troupe serve` on the GPU (prefill and decode
#      devices on cuda_backend), greedy replies over HTTP against troupe generate on the CPU,
#      plain and with --spec dspark. The CLI's build takes minutes more: run it as a second
#      call when the first passed.
# Fails loudly (exit 1) without a GPU. Budget: under 8 minutes on one H200 without --serve
# (each step has its own timeout). Usage: bench/gpu_check.sh [--serve] [build dir, default
# build-gpu]
set -uo pipefail
cd "$(dirname "$0")/.."
serve=0
if [ "${1:-}" == "--serve" ]; then serve=1; shift; fi
build=${1:-build-gpu}
started=$(date +%s)
say() { printf '\n== %s (%ds)\n' "$*" $(( $(date +%s) - started )); }
die() { printf '\ngpu_check: FAILED: %s\n' "$*" >&2; exit 1; }

say "device"
command -v nvidia-smi >/dev/null || die "no nvidia-smi: this machine has no NVIDIA driver, so no GPU to check"
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader \
  || die "nvidia-smi sees no GPU"
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
case "$cap" in
  90|100) ;;
  *) echo "warning: compute capability $cap; the engine targets 90 (Hopper) and 100 (Blackwell)";;
esac
export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || die "no nvcc (the CUDA toolkit is expected in /usr/local/cuda)"

say "configure + build for sm_$cap"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
timeout 120 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$cap" "${launcher[@]}" >"$build.configure.log" 2>&1 \
  || { tail -30 "$build.configure.log"; die "configure (log: $build.configure.log)"; }
grep "CUDA engine" "$build.configure.log"
targets=(test_cuda_host test_cuda bench_cuda_kernels)
build_limit=300
if [ $serve -eq 1 ]; then targets+=(troupe); build_limit=540; fi
timeout $build_limit ninja -C "$build" -j"$(nproc)" "${targets[@]}" >"$build.build.log" 2>&1 \
  || { tail -40 "$build.build.log"; die "build (log: $build.build.log)"; }

status=0
say "host-side planning tests (CPU)"
# The emulated device's forward-pass and backend tests run in every `make test`; here only the
# plans and kernels.
timeout 60 "$build/tests/test_cuda_host" -tce="emulated device*" \
  || { echo "test_cuda_host FAILED"; status=1; }

say "device tests: kernels vs the CPU math, NCCL, EP 2 vs EP 1, the device port"
timeout 120 "$build/tests/test_cuda" --success=false
rc=$?
if [ $rc -eq 77 ]; then die "test_cuda found no usable CUDA device"; fi
[ $rc -eq 0 ] || { echo "test_cuda FAILED (exit $rc)"; status=1; }

say "the device forward pass and DSpark drafts vs the CPU engine"
timeout 90 "$build/tests/test_cuda" -tc="device: the forward pass*,device: the tiny preset*,device: the DSpark draft layers*,cuda_backend opens*" --success=false | grep "MESSAGE" \
  || echo "(no figures: see the device tests above)"

say "throughput against the device's limits"
timeout 120 "$build/bench/bench_cuda_kernels" || { echo "bench_cuda_kernels FAILED"; status=1; }

if [ $serve -eq 1 ]; then
  say "troupe serve on the GPU (bench/serve_check.sh, local-cuda.toml)"
  timeout 300 bench/serve_check.sh "$build/troupe" examples/topologies/local-cuda.toml \
    || { echo "serve_check FAILED"; status=1; }
fi

say "done"
[ $status -eq 0 ] && echo "gpu_check: passed (kernel correctness); see the table for the throughput goals" \
  || echo "gpu_check: FAILED" >&2
exit $status

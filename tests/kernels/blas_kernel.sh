#!/usr/bin/env bash
# Runs the kernels test suite (every numerical comparison: goldens, parity, batch invariance,
# bounded replay, DSpark) under one OpenBLAS kernel, as a machine whose CPU picks that kernel
# would: OPENBLAS_CORETYPE=CORE. Exits 77 (ctest: skipped) when this CPU cannot execute CORE.
#   blas_kernel.sh CORE TEST_KERNELS_EXE [doctest args...]
set -euo pipefail
core=$1; exe=$2; shift 2
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
need=()
case "$core" in
  Prescott)   need=(sse3) ;;
  Haswell)    need=(avx2 fma) ;;
  SkylakeX)   need=(avx512f avx512cd avx512bw avx512dq avx512vl) ;;
  Cooperlake) need=(avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16) ;;
  *) echo "blas_kernel.sh: unknown core '$core'" >&2; exit 2 ;;
esac
for f in "${need[@]}"; do
  # /proc/cpuinfo spells sse3 as pni.
  name=$f; [ "$f" = sse3 ] && name=pni
  if [[ "$flags" != *" $name "* ]]; then
    echo "skipped: this CPU lacks $f, needed by the $core kernel"
    exit 77
  fi
done
export OPENBLAS_CORETYPE=$core
exec "$exe" "$@"

#!/usr/bin/env bash
# troupe runs its GEMMs on the CPU's vector units even where OpenBLAS does not know the CPU
# model and falls back to its generic SSE3 "Prescott" kernel (kernels/cpu_ops.hpp,
# reexec_with_blas_kernel_upgrade): on a CPU with AVX2 and FMA, `troupe version` names another
# kernel; an OPENBLAS_CORETYPE the operator set is kept as it is.
#   blas_upgrade.sh TROUPE
set -euo pipefail
troupe=$1
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
kernel() { "$@" | sed -n 's/.*(OpenBLAS kernel \(.*\))$/\1/p'; }
default=$(kernel "$troupe" version)
echo "default: $default"
[ -n "$default" ] || { echo "FAIL: troupe version names no OpenBLAS kernel"; exit 1; }
if [[ "$flags" == *" avx2 "* && "$flags" == *" fma "* ]]; then
  [ "$default" != Prescott ] || { echo "FAIL: the CPU has AVX2 and FMA, the kernel is Prescott"; exit 1; }
fi
forced=$(OPENBLAS_CORETYPE=Prescott kernel "$troupe" version)
echo "OPENBLAS_CORETYPE=Prescott: $forced"
[ "$forced" = Prescott ] || { echo "FAIL: the operator's OPENBLAS_CORETYPE=Prescott was not kept"; exit 1; }
echo "ok"

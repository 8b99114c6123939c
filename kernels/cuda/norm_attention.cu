// RMSNorm, attention over the window and the indexer's top-k on the device (kernels/cuda/ops.hpp).
#include "kernels/cuda/block_kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.hpp"

namespace troupe::kernels::cuda {

result<bool> rms_norm(float* x, std::int64_t rows, std::int64_t n, const float* weight, float eps,
                      void* stream) {
  if (rows <= 0 || n <= 0) return true;
  TROUPE_LAUNCH(rms_norm_kernel, static_cast<unsigned>(rows), block_threads, 0, stream, x, n,
                weight, eps);
  return launched("rms_norm");
}

result<bool> swa_decode_attention(const swa_decode_args& a, void* stream) {
  if (a.batch <= 0) return true;
  if (a.capacity > swa_max_keys || a.window > a.capacity || a.window < 1)
    return result<bool>::failure("swa_decode_attention: window " + std::to_string(a.window) +
                                 " and ring capacity " + std::to_string(a.capacity) +
                                 " must satisfy window <= capacity <= " +
                                 std::to_string(swa_max_keys));
  if (a.n_selected != nullptr &&
      (a.compressed == nullptr || a.selected == nullptr || a.max_selected < 0 ||
       a.window + a.max_selected > swa_max_keys))
    return result<bool>::failure("swa_decode_attention: window " + std::to_string(a.window) +
                                 " + " + std::to_string(a.max_selected) +
                                 " selected compressed entries (with their rows and indices) "
                                 "must be at most " + std::to_string(swa_max_keys) + " keys");
  if (a.rope_dim % 2 != 0 || a.rope_dim > a.head_dim)
    return result<bool>::failure("swa_decode_attention: rope_dim " + std::to_string(a.rope_dim));
  if (a.chunk != nullptr &&
      (a.sequence == nullptr || a.chunk_start == nullptr || a.chunk_row == nullptr))
    return result<bool>::failure(
        "swa_decode_attention: a chunk needs each query's sequence, chunk start and chunk row");
  const dim3 grid(static_cast<unsigned>(a.batch), static_cast<unsigned>(a.heads));
  const std::size_t shared =
      sizeof(float) * static_cast<std::size_t>(2 * a.head_dim + swa_max_keys);
  TROUPE_LAUNCH(swa_decode_kernel, grid, block_threads, shared, stream, a);
  return launched("swa_decode_attention");
}

result<bool> top_k_rows(const float* scores, std::int64_t rows, std::int64_t n, std::int64_t k,
                        const std::int64_t* offset, std::int64_t* idx, std::int64_t* count,
                        void* stream) {
  if (rows <= 0) return true;
  if (k < 0) return result<bool>::failure("top_k_rows: k " + std::to_string(k));
  const std::int64_t most = k < n ? k : n;
  if (most <= radix_max_k && n < (std::int64_t{1} << 31)) {
    std::size_t sorted = 1;
    while (static_cast<std::int64_t>(sorted) < most) sorted <<= 1;
    TROUPE_LAUNCH(top_k_radix_kernel, static_cast<unsigned>(rows), block_threads,
                  sorted * sizeof(std::uint64_t), stream, scores, n, k, offset, idx, count);
    return launched("top_k_rows");
  }
  TROUPE_LAUNCH(top_k_kernel, static_cast<unsigned>(rows), block_threads, 0, stream, scores, n, k,
                offset, idx, count);
  return launched("top_k_rows");
}

}  // namespace troupe::kernels::cuda

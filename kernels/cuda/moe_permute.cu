// The MoE dispatch / combine permutations on the device (kernels/cuda/ops.hpp), mirroring
// kernels/ep_dispatch.cpp's gather_rows and combine_rows; the kernels are in block_kernels.cuh.
#include "kernels/cuda/block_kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.hpp"

namespace troupe::kernels::cuda {

result<bool> moe_gather_rows(const float* x, const std::int32_t* send_copy, std::int64_t rows,
                             std::int32_t top_k, std::int64_t width, float* out, void* stream) {
  if (rows <= 0) return true;
  TROUPE_LAUNCH(gather_kernel, static_cast<unsigned>(rows), block_threads, 0, stream, x,
                send_copy, top_k, width, out);
  return launched("moe_gather_rows");
}

result<bool> moe_combine_rows(const float* returned, const std::int32_t* copy_row,
                              const float* weights, std::int64_t tokens, std::int32_t top_k,
                              std::int64_t width, float* y, void* stream) {
  if (tokens <= 0) return true;
  TROUPE_LAUNCH(combine_kernel, static_cast<unsigned>(tokens), block_threads, 0, stream,
                returned, copy_row, weights, tokens, top_k, width, y);
  return launched("moe_combine_rows");
}

}  // namespace troupe::kernels::cuda

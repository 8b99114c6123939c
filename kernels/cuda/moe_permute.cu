// The MoE dispatch / combine permutations on the device (kernels/cuda/ops.hpp), mirroring
// kernels/ep_dispatch.cpp's gather_rows and combine_rows.
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/ops.hpp"

#include <cuda_runtime.h>

namespace troupe::kernels::cuda {

namespace {

__global__ void gather_kernel(const float* x, const std::int32_t* send_copy, std::int32_t top_k,
                              std::int64_t width, float* out) {
  const std::int64_t i = blockIdx.x;
  const float* src = x + static_cast<std::int64_t>(send_copy[i] / top_k) * width;
  for (std::int64_t d = threadIdx.x; d < width; d += blockDim.x) out[i * width + d] = src[d];
}

// One thread per output element; the k terms in ascending slot order, every product and sum
// rounded on its own (no FMA), as the CPU reference.
__global__ void combine_kernel(const float* returned, const std::int32_t* copy_row,
                               const float* weights, std::int64_t tokens, std::int32_t top_k,
                               std::int64_t width, float* y) {
  const std::int64_t t = blockIdx.x;
  for (std::int64_t d = threadIdx.x; d < width; d += blockDim.x) {
    float acc = 0.0f;
    for (std::int32_t j = 0; j < top_k; ++j) {
      const std::int64_t c = t * top_k + j;
      acc = __fadd_rn(acc, __fmul_rn(weights[c], returned[copy_row[c] * width + d]));
    }
    y[t * width + d] = acc;
  }
}

result<bool> launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return result<bool>::failure(std::string(what) + ": " + cuda_error_text(e));
  return true;
}

}  // namespace

result<bool> moe_gather_rows(const float* x, const std::int32_t* send_copy, std::int64_t rows,
                             std::int32_t top_k, std::int64_t width, float* out, void* stream) {
  if (rows <= 0) return true;
  gather_kernel<<<static_cast<unsigned>(rows), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      x, send_copy, top_k, width, out);
  return launched("moe_gather_rows");
}

result<bool> moe_combine_rows(const float* returned, const std::int32_t* copy_row,
                              const float* weights, std::int64_t tokens, std::int32_t top_k,
                              std::int64_t width, float* y, void* stream) {
  if (tokens <= 0) return true;
  combine_kernel<<<static_cast<unsigned>(tokens), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      returned, copy_row, weights, tokens, top_k, width, y);
  return launched("moe_combine_rows");
}

}  // namespace troupe::kernels::cuda

// RMSNorm and sliding-window decode attention on the device (kernels/cuda/ops.hpp).
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/portable_math.hpp"

#include <cuda_runtime.h>

namespace troupe::kernels::cuda {

namespace {

constexpr int threads = 256;

// Sum over the block; every thread gets the total. `scratch` holds threads / 32 floats.
__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  return total;
}

__global__ void rms_norm_kernel(float* x, std::int64_t n, const float* weight, float eps) {
  __shared__ float scratch[threads / 32];
  float* row = x + blockIdx.x * n;
  float sum = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += row[i] * row[i];
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x)
    row[i] = weight != nullptr ? weight[i] * (row[i] * inv) : row[i] * inv;
}

// One block per (query, head): warps take keys in turn for the scores (lanes stride over
// the head's channels), then the softmax with the sink, then threads take channels for the
// weighted sum of the same rows, then the inverse RoPE of the rotated pairs. Keys 0 … nw − 1
// are the window's rows (from the ring, or from the call's chunk at and after its start), the
// rest the selected compressed rows.
__global__ void swa_decode_kernel(swa_decode_args a) {
  extern __shared__ float shared[];
  const std::int64_t b = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
  float* q = shared;            // [hd]
  float* out = q + hd;          // [hd]
  float* p = out + hd;          // [swa_max_keys]
  __shared__ float stats[2];    // max, sum

  const std::int64_t pos = a.positions[b];
  const std::int64_t seq = a.chunk != nullptr ? a.sequence[b] : b;
  // Positions from `start` on are the call's chunk rows (decode: none; the ring holds them all).
  const std::int64_t start = a.chunk != nullptr ? a.chunk_start[b] : pos + 1;
  std::int64_t first = pos - a.window + 1;
  if (first < 0) first = 0;
  const std::int64_t oldest = a.ring_begin[seq] < start ? a.ring_begin[seq] : start;
  if (first < oldest) first = oldest;
  const int nw = static_cast<int>(pos - first + 1);
  const int nk = nw + (a.n_selected != nullptr ? static_cast<int>(a.n_selected[b]) : 0);
  const float* qh = a.q + (b * a.heads + h) * hd;
  const float* ring = a.rings + seq * a.capacity * hd;
  const std::int64_t* sel = a.selected + b * a.max_selected;
  auto key = [&](int k) {
    if (k >= nw) return a.compressed + sel[k - nw] * hd;
    const std::int64_t kp = first + k;
    return kp < start ? ring + (kp % a.capacity) * hd
                      : a.chunk + (a.chunk_row[b] + kp - start) * hd;
  };
  for (std::int64_t i = threadIdx.x; i < hd; i += blockDim.x) q[i] = qh[i];
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int k = warp; k < nk; k += warps) {
    const float* row = key(k);
    float dot = 0;
    for (std::int64_t i = lane; i < hd; i += 32) dot += q[i] * row[i];
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) p[k] = dot * a.scaling;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Sequential, as the CPU: the running max from the sink, then the sum of exponentials.
    const float sink = a.sinks[h];
    float mx = sink;
    for (int k = 0; k < nk; ++k) mx = fmaxf(mx, p[k]);
    float sum = expf(sink - mx);
    for (int k = 0; k < nk; ++k) sum += p[k] = expf(p[k] - mx);
    stats[0] = mx;
    stats[1] = sum;
  }
  __syncthreads();
  const float inv_sum = 1.0f / stats[1];
  for (int k = threadIdx.x; k < nk; k += blockDim.x) p[k] = p[k] * inv_sum;
  __syncthreads();
  for (std::int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
    float acc = 0;
    for (int k = 0; k < nk; ++k) acc += p[k] * key(k)[i];
    out[i] = acc;
  }
  __syncthreads();
  // Inverse RoPE over the trailing rope_dim channels, a pair per thread, as the CPU model.
  float* dst = a.out + (b * a.heads + h) * hd;
  const std::int64_t base = hd - a.rope_dim;
  for (std::int64_t i = threadIdx.x; i < base; i += blockDim.x) dst[i] = out[i];
  for (std::int64_t pair = threadIdx.x; pair < a.rope_dim / 2; pair += blockDim.x) {
    dst[base + 2 * pair] = out[base + 2 * pair];
    dst[base + 2 * pair + 1] = out[base + 2 * pair + 1];
    portable::rope_pair(dst + base, pair, a.inv_freq[pair], static_cast<float>(pos),
                        a.rope_scaling, /*inverse=*/true);
  }
}

result<bool> launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return result<bool>::failure(std::string(what) + ": " + cuda_error_text(e));
  return true;
}

}  // namespace

result<bool> rms_norm(float* x, std::int64_t rows, std::int64_t n, const float* weight, float eps,
                      void* stream) {
  if (rows <= 0 || n <= 0) return true;
  rms_norm_kernel<<<static_cast<unsigned>(rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, n, weight, eps);
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
  const std::size_t shared = sizeof(float) * static_cast<std::size_t>(2 * a.head_dim + swa_max_keys);
  swa_decode_kernel<<<grid, threads, shared, static_cast<cudaStream_t>(stream)>>>(a);
  return launched("swa_decode_attention");
}

}  // namespace troupe::kernels::cuda

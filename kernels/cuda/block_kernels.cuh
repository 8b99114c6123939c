// The CUDA kernels whose threads work together (shared memory, __syncthreads, warp shuffles):
// RMSNorm's block reduction, attention over the window, Engram's gated add, the indexer's
// top-k selection; and the MoE
// dispatch / combine permutations (a block per row, its threads over the row). They live in this
// header so that two compilers build them: nvcc for the device (norm_attention.cu,
// portable_ops.cu launch them), and g++ for tests/cuda_host/, which runs them on the CPU under
// a small SIMT emulator (tests/cuda_host/simt.hpp: a fiber per thread, barriers for
// __syncthreads and the shuffles) against the CPU engine. What the emulator cannot show is the
// device's own behaviour: its math library, scheduling and memory.
#pragma once

#include <cstdint>

#include "kernels/cuda/ops.hpp"
#include "kernels/portable_math.hpp"

#ifndef TROUPE_DYNAMIC_SHARED
#define TROUPE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace troupe::kernels::cuda {

/// Threads per block of these kernels (a multiple of the warp size).
inline constexpr int block_threads = 256;

// Each file that launches them has its own copy (kernels are not inline functions).
namespace {

// Sum over the block; every thread gets the total. `scratch` holds block_threads / 32 floats.
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
  __shared__ float scratch[block_threads / 32];
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
  TROUPE_DYNAMIC_SHARED(float, shared);
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
  const std::int64_t rope_pos = a.rope_positions != nullptr ? a.rope_positions[b] : pos;
  for (std::int64_t i = threadIdx.x; i < base; i += blockDim.x) dst[i] = out[i];
  for (std::int64_t pair = threadIdx.x; pair < a.rope_dim / 2; pair += blockDim.x) {
    dst[base + 2 * pair] = out[base + 2 * pair];
    dst[base + 2 * pair + 1] = out[base + 2 * pair + 1];
    portable::rope_pair(dst + base, pair, a.inv_freq[pair], static_cast<float>(rope_pos),
                        a.rope_scaling, /*inverse=*/true);
  }
}

// One block per (token, stream): its first thread computes the gate from the stream as it is,
// then the block adds gate · value to the stream.
__global__ void engram_kernel(float* streams, const float* kv, const float* weight,
                              std::int64_t hc, std::int64_t D, float eps) {
  __shared__ float gate;
  const std::int64_t tk = blockIdx.x, t = tk / hc, k = tk % hc;
  float* h = streams + tk * D;
  const float* row = kv + t * (hc + 1) * D;
  if (threadIdx.x == 0) gate = portable::engram_gate(h, row + k * D, weight + k * D, D, eps);
  __syncthreads();
  const float* value = row + hc * D;
  for (std::int64_t d = threadIdx.x; d < D; d += blockDim.x) h[d] = h[d] + gate * value[d];
}

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

// Whether (a, at) ranks before (b, bt) in the indexer's order: the higher score, then the lower
// index; bt < 0 is no entry at all.
__device__ inline bool ranks_before(float a, std::int64_t at, float b, std::int64_t bt) {
  return bt < 0 || a > b || (a == b && at < bt);
}

// One block per row of scores [rows, n]: its k best entries in that order, stopping at the
// first -inf (kernels/model.cpp's top_finite drops those). Pass j takes the best entry ranked
// after pass j − 1's pick: each thread its own best over a stride of the row, then a tree
// reduction in shared memory. Indices plus offset[row] (null: 0) go to idx [rows, k], how many
// to count[rows].
__global__ void top_k_kernel(const float* scores, std::int64_t n, std::int64_t k,
                             const std::int64_t* offset, std::int64_t* idx, std::int64_t* count) {
  __shared__ float best[block_threads];
  __shared__ std::int64_t best_at[block_threads];
  const std::int64_t r = blockIdx.x, tid = threadIdx.x;
  const float* row = scores + r * n;
  float prev = INFINITY;
  std::int64_t prev_at = -1, taken = 0;
  for (; taken < k; ++taken) {
    float b = -INFINITY;
    std::int64_t at = -1;
    for (std::int64_t i = tid; i < n; i += blockDim.x) {
      const float v = row[i];
      if (!(v < prev || (v == prev && i > prev_at))) continue;  // picked already
      if (ranks_before(v, i, b, at)) b = v, at = i;
    }
    best[tid] = b;
    best_at[tid] = at;
    __syncthreads();
    for (std::int64_t w = blockDim.x / 2; w > 0; w /= 2) {
      if (tid < w && best_at[tid + w] >= 0 &&
          ranks_before(best[tid + w], best_at[tid + w], best[tid], best_at[tid]))
        best[tid] = best[tid + w], best_at[tid] = best_at[tid + w];
      __syncthreads();
    }
    prev = best[0];
    prev_at = best_at[0];
    __syncthreads();  // every thread has the pick before the next pass overwrites it
    if (prev_at < 0 || prev == -INFINITY) break;
    if (tid == 0) idx[r * k + taken] = prev_at + (offset != nullptr ? offset[r] : 0);
  }
  if (tid == 0) count[r] = taken;
}

}  // namespace

}  // namespace troupe::kernels::cuda

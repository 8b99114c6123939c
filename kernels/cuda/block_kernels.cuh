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
#include <cstring>

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

// Batch-invariant mode's projection y[m, n] = x[m, k] · w[n, k]ᵀ in tiles: a block of 256
// threads computes 64 × 64 outputs, each thread 4 × 4 of them (rows ty + 16 i, columns tx + 16 j),
// reading x and w through shared memory 16 columns of k at a time. Every output is still its k
// products summed in ascending order, each product and sum rounded on its own, from 0: the bits
// of a thread per output (and of the row alone, whatever m is), with each value of x and w read
// from global memory once per tile instead of once per output.
inline constexpr int project_tile = 64, project_slab = 16;
static_assert(block_threads == 16 * 16, "project_tiled_kernel: a 16 x 16 grid of threads");

__global__ void project_tiled_kernel(const float* x, std::int64_t ldx, const float* w,
                                     std::int64_t ldw, float* y, std::int64_t ldy, std::int64_t m,
                                     std::int64_t n, std::int64_t k) {
  // Slab-major, one padding column against bank conflicts: xs[j][r] is x[row0 + r, j0 + j].
  __shared__ float xs[project_slab][project_tile + 1];
  __shared__ float ws[project_slab][project_tile + 1];
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.y) * project_tile;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.x) * project_tile;
  const int tx = static_cast<int>(threadIdx.x % 16), ty = static_cast<int>(threadIdx.x / 16);
  float acc[4][4] = {};
  for (std::int64_t j0 = 0; j0 < k; j0 += project_slab) {
    // Consecutive threads read consecutive columns of k of one row.
    for (int l = static_cast<int>(threadIdx.x); l < project_tile * project_slab;
         l += static_cast<int>(blockDim.x)) {
      const int r = l / project_slab, j = l % project_slab;
      const std::int64_t gj = j0 + j, gr = row0 + r, gc = col0 + r;
      xs[j][r] = gr < m && gj < k ? x[gr * ldx + gj] : 0.0f;
      ws[j][r] = gc < n && gj < k ? w[gc * ldw + gj] : 0.0f;
    }
    __syncthreads();
    const int slab = k - j0 < project_slab ? static_cast<int>(k - j0) : project_slab;
    for (int j = 0; j < slab; ++j) {
      float a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = xs[j][ty + 16 * i], b[i] = ws[j][tx + 16 * i];
      for (int i = 0; i < 4; ++i)
        for (int c = 0; c < 4; ++c) acc[i][c] = __fadd_rn(acc[i][c], __fmul_rn(a[i], b[c]));
    }
    __syncthreads();  // the slab read by every thread before the next one is written
  }
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 4; ++c) {
      const std::int64_t r = row0 + ty + 16 * i, col = col0 + tx + 16 * c;
      if (r < m && col < n) y[r * ldy + col] = acc[i][c];
    }
}

// The indexer's order as an unsigned key: a higher score has a higher key; -0 counts as +0 (the
// CPU's comparisons tie them). Scores are not NaN.
__device__ inline std::uint32_t order_key(float v) {
  if (v == 0.0f) v = 0.0f;
  std::uint32_t b;
  memcpy(&b, &v, sizeof b);
  return (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
}

// Entries per row that top_k_radix_kernel sorts in shared memory at most (8 bytes each, padded
// to a power of two): V4.1's 512 indexer entries and 2,048 candidate blocks fit.
inline constexpr std::int64_t radix_max_k = 4096;

// top_k_kernel's selection in a fixed number of passes, for k <= radix_max_k and rows of under
// 2^31 entries. One block per row: a radix select over the scores' keys, a byte at a time from
// the top (a 256-bin histogram of the entries whose higher bytes match the prefix chosen so
// far; -inf is never counted), finds the key T of the kk-th best entry, kk = min(k, entries
// above -inf), and how many entries keyed T it takes (the lowest indices: warp ballots count
// the ties before each one in row order). The kk entries go to shared memory as (key, ~index)
// and a bitonic sort puts them in the order the CPU gives. Dynamic shared memory: 8 bytes times
// the power of two at or above min(k, n).
__global__ void top_k_radix_kernel(const float* scores, std::int64_t n, std::int64_t k,
                                   const std::int64_t* offset, std::int64_t* idx,
                                   std::int64_t* count) {
  TROUPE_DYNAMIC_SHARED(std::uint64_t, picked);
  __shared__ unsigned hist[256];
  __shared__ unsigned warp_ties[block_threads / 32];
  __shared__ unsigned chosen_prefix, chosen_want, chosen_ties, chosen_kk, filled;
  const std::int64_t r = blockIdx.x;
  const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float* row = scores + r * n;
  const std::uint32_t floor_key = order_key(-INFINITY);

  std::uint32_t prefix = 0, mask = 0;
  unsigned want = 0, ties = 0, kk = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (unsigned b = tid; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (std::int64_t i = tid; i < n; i += blockDim.x) {
      const std::uint32_t key = order_key(row[i]);
      if (key > floor_key && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      if (shift == 24) {
        std::int64_t above = 0;
        for (int b = 0; b < 256; ++b) above += hist[b];
        chosen_kk = static_cast<unsigned>(above < k ? above : k);
        chosen_want = chosen_kk;
      }
      // The bin holding the chosen_want-th best of the entries that match the prefix.
      unsigned w = chosen_want, before = 0;
      int b = 255;
      if (w > 0) {
        for (; b > 0 && before + hist[b] < w; --b) before += hist[b];
        chosen_prefix = prefix | static_cast<std::uint32_t>(b) << shift;
        chosen_want = w - before;
        chosen_ties = hist[b];
      }
      filled = 0;
    }
    __syncthreads();
    kk = chosen_kk;
    if (kk == 0) break;
    prefix = chosen_prefix;
    want = chosen_want;
    ties = chosen_ties;
    mask |= 255u << shift;
  }
  if (kk == 0) {
    if (tid == 0) count[r] = 0;
    return;
  }

  // The entries above T, and `want` of the `ties` keyed T: all of them when that is all, else
  // the first `want` in row order.
  const std::uint32_t threshold = prefix;
  auto pick = [&](std::int64_t i, std::uint32_t key) {
    picked[atomicAdd(&filled, 1u)] =
        static_cast<std::uint64_t>(key) << 32 | static_cast<std::uint32_t>(~static_cast<std::uint32_t>(i));
  };
  if (want == ties) {
    for (std::int64_t i = tid; i < n; i += blockDim.x) {
      const std::uint32_t key = order_key(row[i]);
      if (key >= threshold) pick(i, key);
    }
  } else {
    unsigned seen = 0;  // ties in the chunks before this one
    for (std::int64_t base = 0; base < n; base += blockDim.x) {
      const std::int64_t i = base + tid;
      const std::uint32_t key = i < n ? order_key(row[i]) : 0;
      const unsigned tied = __ballot_sync(0xffffffffu, key == threshold);
      if (lane == 0) warp_ties[warp] = __popc(tied);
      __syncthreads();
      unsigned before = seen + __popc(tied & ((1u << lane) - 1u)), chunk = 0;
      for (unsigned w = 0; w < blockDim.x / 32; ++w) {
        before += w < warp ? warp_ties[w] : 0;
        chunk += warp_ties[w];
      }
      if (key > threshold || (key == threshold && before < want)) pick(i, key);
      seen += chunk;
      __syncthreads();  // warp_ties read by every thread before the next chunk's counts
    }
  }

  // Bitonic sort, descending, of the kk picks padded with zeros (below every pick) to a power of
  // two.
  unsigned size = 1;
  while (size < kk) size <<= 1;
  for (unsigned j = kk + tid; j < size; j += blockDim.x) picked[j] = 0;
  __syncthreads();
  for (unsigned run = 2; run <= size; run <<= 1)
    for (unsigned stride = run / 2; stride > 0; stride >>= 1) {
      for (unsigned i = tid; i < size; i += blockDim.x) {
        const unsigned j = i ^ stride;
        if (j <= i) continue;
        const std::uint64_t a = picked[i], b = picked[j];
        if ((i & run) == 0 ? a < b : a > b) picked[i] = b, picked[j] = a;
      }
      __syncthreads();
    }
  const std::int64_t add = offset != nullptr ? offset[r] : 0;
  for (unsigned j = tid; j < kk; j += blockDim.x)
    idx[r * k + j] = static_cast<std::int64_t>(~static_cast<std::uint32_t>(picked[j])) + add;
  if (tid == 0) count[r] = kk;
}

}  // namespace

}  // namespace troupe::kernels::cuda

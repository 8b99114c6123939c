// The CUDA kernels of kernels/cuda/portable_ops.cu: one thread per token, element or block,
// each running the CPU engine's own function (kernels/portable_math.hpp) through a functor.
// They live in this header so that two compilers build them: nvcc for the device, and g++ for
// tests/cuda_host/, which runs them on the CPU under the SIMT emulator (tests/cuda_host/simt.hpp)
// to check each functor's index mapping against the CPU engine's loops.
#pragma once

#include <cstdint>

#include "kernels/cuda/paging.hpp"
#include "kernels/portable_math.hpp"

namespace troupe::kernels::cuda {

// Each file that launches them has its own copy (kernels are not inline functions).
namespace {

// f(i) for every i in [0, n), one thread each.
template <class F>
__global__ void each_index(std::int64_t n, F f) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}

struct mixes_fn {
  const float *mixes, *scale, *base;
  std::int64_t hc, iters;
  float hc_eps;
  float *pre, *post, *comb;
  __device__ void operator()(std::int64_t t) const {
    portable::hc_token_mixes(mixes + t * (2 + hc) * hc, scale, base, hc, iters, hc_eps,
                             pre + t * hc, post + t * hc, comb + t * hc * hc);
  }
};

struct collapse_fn {
  const float *streams, *pre;
  std::int64_t hc, D;
  float* out;
  __device__ void operator()(std::int64_t i) const {
    out[i] = portable::hc_collapse_at(streams, pre, hc, D, i / D, i % D);
  }
};

struct expand_fn {
  const float *streams, *x, *post, *comb;
  std::int64_t hc, D;
  float* out;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t d = i % D, tk = i / D;
    out[i] = portable::hc_expand_at(streams, x, post, comb, hc, D, tk / hc, tk % hc, d);
  }
};

struct route_fn {
  float* scores;
  const float* bias;
  std::int64_t n, k;
  portable::router_scoring f;
  float gate_temp;
  bool norm_topk_prob;
  float routed_scaling;
  std::int64_t* experts;
  float* weights;
  __device__ void operator()(std::int64_t t) const {
    portable::route_token(scores + t * n, bias, n, k, f, gate_temp, norm_topk_prob,
                          routed_scaling, experts + t * k, weights + t * k);
  }
};

struct pool_fn {
  const float *kv, *gate;
  std::int64_t r, hd;
  float* out;
  __device__ void operator()(std::int64_t i) const {
    out[i] = portable::compress_pool_at(kv, gate, r, hd, i / hd, i % hd);
  }
};

struct index_fn {
  const float *head_dot, *w;
  std::int64_t nh, entries;
  float sm_scale, heads_scale;
  float* scores;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t q = i / entries, e = i % entries;
    scores[i] = portable::index_score(head_dot + q * nh * entries + e, entries, w + q * nh, nh,
                                      sm_scale, heads_scale);
  }
};

struct dequant_fn {
  const std::uint8_t *w, *scales;
  std::int64_t cols, br, bc;  // fp4: bc = 0, br = the scale block along a row
  float* out;
  __device__ void operator()(std::int64_t k) const {
    const std::int64_t i = k / cols, j = k % cols;
    out[k] = bc > 0 ? portable::fp8_block_weight(w, scales, cols, br, bc, i, j)
                    : portable::fp4_packed_weight(w, scales, cols, br, i, j);
  }
};

struct swiglu_fn {
  float* g;
  const float* u;
  std::int64_t width;
  float limit;
  const float* row_scale;
  __device__ void operator()(std::int64_t i) const {
    const bool scaled = row_scale != nullptr;
    g[i] = portable::swiglu(g[i], u[i], limit, scaled, scaled ? row_scale[i / width] : 1.0f);
  }
};

struct rope_fn {
  float* x;
  std::int64_t dim, rope_dim, rows_per_position;
  const float* inv_freq;
  float scaling;
  const std::int64_t* positions;
  bool inverse;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t half = rope_dim / 2, row = i / half, pair = i % half;
    portable::rope_pair(x + row * dim + (dim - rope_dim), pair, inv_freq[pair],
                        static_cast<float>(positions[row / rows_per_position]), scaling, inverse);
  }
};

struct quant_fn {
  float* x;
  std::int64_t block;
  bool fp4, e4m3_scales;
  __device__ void operator()(std::int64_t b) const {
    if (fp4)
      portable::quant_fp4_block(x + b * block, block, e4m3_scales);
    else
      portable::quant_fp8_block(x + b * block, block);
  }
};

// The forward pass's data movement (device_model.cpp).
struct embed_fn {  // every stream of token t starts as the embedding row of tokens[t]
  const float* table;
  const std::int64_t* tokens;
  std::int64_t copies, D;
  float* out;
  __device__ void operator()(std::int64_t i) const {
    out[i] = table[tokens[i / (copies * D)] * D + i % D];
  }
};

struct paged_rows_fn {  // entry j < count[r] of row r: its sequence's group -> its store row
  const std::int64_t* groups;
  const std::int64_t* count;
  const std::int64_t* pages;
  const std::int64_t* pages_at;
  std::int64_t k, rows;
  std::int64_t* out;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t r = i / k;
    if (i % k < count[r]) out[i] = paged_row(pages + pages_at[r], rows, groups[i]);
  }
};

struct copy_rows_fn {  // dst row dst_rows[r] (null: r) = src row src_rows[r] (null: r)
  const float* src;
  const std::int64_t* src_rows;
  float* dst;
  const std::int64_t* dst_rows;
  std::int64_t width;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t r = i / width, c = i % width;
    const std::int64_t from = src_rows != nullptr ? src_rows[r] : r;
    const std::int64_t to = dst_rows != nullptr ? dst_rows[r] : r;
    dst[to * width + c] = src[from * width + c];
  }
};

struct add_fn {  // y += x
  float* y;
  const float* x;
  __device__ void operator()(std::int64_t i) const { y[i] = y[i] + x[i]; }
};

// The CSA2 indexer's masks (device_model.cpp), on scores [rows, n].
struct mask_scores_fn {  // -inf past the row's reach, or outside the row's kept candidate blocks
  float* scores;
  std::int64_t n;
  const std::int64_t* reach;
  const std::int64_t *kept, *kept_n;  // null: no candidate mask
  std::int64_t kept_max, block;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t r = i / n, e = i % n;
    bool keep = e < reach[r];
    if (keep && kept != nullptr) {
      keep = false;
      for (std::int64_t j = 0; j < kept_n[r]; ++j) keep = keep || kept[r * kept_max + j] == e / block;
    }
    if (!keep) scores[i] = -INFINITY;
  }
};

struct block_max_fn {  // each block of `block` entries' max score; the row's last visible block +inf
  const float* scores;
  std::int64_t n, block, blocks;
  const std::int64_t* last;
  float* out;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t r = i / blocks, b = i % blocks;
    float m = -INFINITY;
    for (std::int64_t e = b * block; e < n && e < (b + 1) * block; ++e)
      m = portable::max_of(m, scores[r * n + e]);
    out[i] = last[r] == b ? INFINITY : m;
  }
};

}  // namespace

}  // namespace troupe::kernels::cuda

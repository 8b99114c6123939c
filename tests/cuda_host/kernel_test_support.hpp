// What the tests of the CUDA kernels share (tests/cuda_host/ under the SIMT emulator, tests/cuda/
// on a device): random inputs, the released RoPE, the CPU model's attention for one query head
// written out, the attention kernel's common arguments, and an MoE dispatch case.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/cpu_ops.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/ep_dispatch.hpp"
#include "kernels/kv_cache.hpp"

namespace troupe::test {

/// n values uniform in [lo, hi) from `seed`.
inline std::vector<float> random_values(std::size_t n, std::uint32_t seed, float lo = -1,
                                        float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

/// T tokens' top-k copies of E experts over `ranks` ranks (token t's slot j routed to expert
/// (t · 37 + j · stride) mod E) and rows of `width`: the plan, the inputs, and what the host
/// reference's gather and combine give.
struct moe_case {
  std::int32_t T = 0, k = 0;
  std::int64_t width = 0, rows = 0;
  kernels::dispatch_plan plan;
  std::vector<float> x, weights, returned, gathered, combined;
};
inline moe_case make_moe_case(std::int32_t T, std::int32_t k, std::int32_t E, std::int32_t ranks,
                              std::int32_t stride, std::int64_t width, std::uint32_t seed) {
  moe_case c;
  c.T = T;
  c.k = k;
  c.width = width;
  auto placement = kernels::place_experts(E, ranks);
  REQUIRE(placement.ok());
  std::vector<std::int32_t> ids;
  for (std::int32_t t = 0; t < T; ++t)
    for (std::int32_t j = 0; j < k; ++j) ids.push_back((t * 37 + j * stride) % E);
  auto plan = kernels::plan_dispatch(*placement, ids, k);
  REQUIRE(plan.ok());
  c.plan = std::move(*plan);
  c.x = random_values(static_cast<std::size_t>(T * width), seed);
  c.weights = random_values(static_cast<std::size_t>(T * k), seed + 1, 0, 1);
  c.rows = static_cast<std::int64_t>(c.plan.send_copy.size());
  c.gathered.resize(static_cast<std::size_t>(c.rows * width));
  kernels::gather_rows(c.plan, c.x.data(), width, c.gathered.data());
  c.returned = random_values(c.gathered.size(), seed + 2);  // stands in for the experts' outputs
  c.combined.resize(static_cast<std::size_t>(T * width));
  kernels::combine_rows(c.plan, c.returned.data(), c.weights, width, c.combined.data());
  return c;
}

/// The largest |a − b| over the elements.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

/// The RoPE of a released attention head: 512 channels, the last 64 rotated.
inline kernels::rope_table released_rope() {
  kernels::rope_parameters p;
  p.partial_rotary_factor = 64.0 / 512.0;
  return kernels::make_rope_table(p, 512);
}

/// One query head's attention as the CPU model computes it (kernels/model.cpp's attention_site
/// and sink_attention): scores over `keys` (K = V), a softmax whose denominator also takes the
/// head's sink, the weighted sum of the keys, the inverse RoPE at position p, into o [hd].
inline void cpu_sink_attention(const float* qh, const std::vector<const float*>& keys, float sink,
                               float scaling, std::int64_t hd, const kernels::rope_table& rope,
                               std::int64_t p, float* o) {
  std::vector<float> lg;
  for (const float* key : keys) {
    float dot = 0;
    for (std::int64_t i = 0; i < hd; ++i) dot += qh[i] * key[i];
    lg.push_back(dot * scaling);
  }
  float mx = sink;
  for (float v : lg) mx = std::max(mx, v);
  float sum = std::exp(sink - mx);
  for (float& v : lg) sum += v = std::exp(v - mx);
  for (std::int64_t i = 0; i < hd; ++i) {
    float acc = 0;
    for (std::size_t k = 0; k < lg.size(); ++k) acc += lg[k] / sum * keys[k][i];
    o[i] = acc;
  }
  kernels::apply_rope(o, hd, rope, p, /*inverse=*/true);
}

/// The CPU model's attention for one query at position p, every head, over released-shape
/// rows (512 channels): its window from max(0, p − window + 1, min(ring begin, chunk_start)) to
/// p, positions before chunk_start from `ring` and the rest from the call's chunk (chunk_first:
/// the row of position chunk_start), then n_sel rows of `compressed` named by `selected`. q and
/// out are [heads, 512]. A decode query has chunk_start p + 1 (every row in its ring).
inline void cpu_query_attention(const float* q, std::int64_t heads, const kernels::swa_ring& ring,
                                std::int64_t p, std::int64_t window, std::int64_t chunk_start,
                                const float* chunk_first, const float* compressed,
                                const std::int64_t* selected, std::int64_t n_sel,
                                const float* sinks, const kernels::rope_table& rope, float* out) {
  constexpr std::int64_t hd = 512;
  const std::int64_t first =
      std::max<std::int64_t>({0, p - window + 1, std::min(ring.begin(), chunk_start)});
  std::vector<const float*> keys;
  for (std::int64_t kp = first; kp <= p; ++kp)
    keys.push_back(kp < chunk_start ? ring.at(kp) : chunk_first + (kp - chunk_start) * hd);
  for (std::int64_t k = 0; k < n_sel; ++k) keys.push_back(compressed + selected[k] * hd);
  for (std::int64_t h = 0; h < heads; ++h)
    cpu_sink_attention(q + h * hd, keys, sinks[h], 1.0f / std::sqrt(512.0f), hd, rope, p,
                       out + h * hd);
}

/// The attention kernel's arguments for `batch` queries of `heads` heads of the released shape
/// over rings of `capacity` rows and a window of `window`: q and out [batch, heads, 512], the
/// positions and ring starts, the sinks, the RoPE (inv_freq: where the kernel reads the table);
/// the caller adds the CSA2 and chunk fields it uses.
inline kernels::cuda::swa_decode_args window_args(const float* q, const float* rings,
                                                  const std::int64_t* positions,
                                                  const std::int64_t* ring_begin,
                                                  const float* sinks, const float* inv_freq,
                                                  float* out, std::int64_t batch,
                                                  std::int64_t heads, std::int64_t capacity,
                                                  std::int64_t window,
                                                  const kernels::rope_table& rope) {
  kernels::cuda::swa_decode_args a;
  a.q = q;
  a.rings = rings;
  a.positions = positions;
  a.ring_begin = ring_begin;
  a.sinks = sinks;
  a.inv_freq = inv_freq;
  a.out = out;
  a.batch = batch;
  a.heads = heads;
  a.head_dim = 512;
  a.capacity = capacity;
  a.window = window;
  a.rope_dim = rope.rope_dim;
  a.scaling = 1.0f / std::sqrt(512.0f);
  a.rope_scaling = rope.scaling;
  return a;
}

}  // namespace troupe::test

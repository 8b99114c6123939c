// The CPU model's attention for one query head, written out, for the tests of the CUDA
// attention kernel (tests/cuda_host/ under the SIMT emulator, tests/cuda/ on a device).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu_ops.hpp"

namespace troupe::test {

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

}  // namespace troupe::test

#include "kernels/cpu_ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "kernels/model_init.hpp"
#include "kernels/safetensors.hpp"

namespace troupe::kernels {

void set_blas_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

std::string blas_kernel_name() { return openblas_get_corename(); }

void linear(const float* x, std::int64_t rows, std::int64_t in, const float* w, std::int64_t out,
            float* y) {
  if (rows == 0 || out == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows),
              static_cast<blasint>(out), static_cast<blasint>(in), 1.0f, x,
              static_cast<blasint>(in), w, static_cast<blasint>(in), 0.0f, y,
              static_cast<blasint>(out));
}

void rms_norm(float* x, std::int64_t n, const float* weight, float eps) {
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  if (weight != nullptr) {
    for (std::int64_t i = 0; i < n; ++i) x[i] = weight[i] * (x[i] * inv);
  } else {
    for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
  }
}

rope_table make_rope_table(const rope_parameters& p, std::int64_t head_dim) {
  rope_table t;
  const auto dim =
      static_cast<std::int64_t>(static_cast<double>(head_dim) * p.partial_rotary_factor);
  t.rope_dim = dim;
  const auto half = dim / 2;
  const auto base = static_cast<float>(p.rope_theta);
  std::vector<float> pos_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    pos_freq[static_cast<std::size_t>(i)] =
        std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
  t.inv_freq.resize(static_cast<std::size_t>(half));
  if (p.rope_type != "yarn") {
    for (std::int64_t i = 0; i < half; ++i)
      t.inv_freq[static_cast<std::size_t>(i)] = 1.0f / pos_freq[static_cast<std::size_t>(i)];
    t.scaling = static_cast<float>(p.attention_factor);
    return t;
  }
  // YaRN: frequencies below the correction range are interpolated (divided by `factor`), those
  // above it kept, with a linear ramp in between (bounds floored / ceiled, as `truncate`).
  const double pi = 3.14159265358979323846;
  const auto original = static_cast<double>(p.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(original / (rotations * 2 * pi))) /
           (2 * std::log(p.rope_theta));
  };
  double low = std::max(std::floor(correction_dim(p.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(p.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const auto lowf = static_cast<float>(low);
  const auto spanf = static_cast<float>(high - low);
  const auto factor = static_cast<float>(p.factor);
  for (std::int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp((static_cast<float>(i) - lowf) / spanf, 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;
    const float f = pos_freq[static_cast<std::size_t>(i)];
    t.inv_freq[static_cast<std::size_t>(i)] =
        (1.0f / (factor * f)) * (1.0f - extrapolation) + (1.0f / f) * extrapolation;
  }
  t.scaling = static_cast<float>(p.attention_factor);
  return t;
}

void apply_rope(float* v, std::int64_t dim, const rope_table& t, std::int64_t position,
                bool inverse) {
  float* r = v + (dim - t.rope_dim);
  const auto pos = static_cast<float>(position);
  const auto half = t.rope_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const float angle = t.inv_freq[static_cast<std::size_t>(i)] * pos;
    const float c = std::cos(angle) * t.scaling;
    const float s = (inverse ? -std::sin(angle) : std::sin(angle)) * t.scaling;
    const float even = r[2 * i];
    const float odd = r[2 * i + 1];
    r[2 * i] = even * c - odd * s;
    r[2 * i + 1] = even * s + odd * c;
  }
}

float round_to_e4m3(float x) { return fp8_e4m3_to_float(float_to_fp8_e4m3(x)); }

namespace {

// 2^ceil(log2(t)) for a positive normal float, as the reference computes it from the bits.
float pow2_ceil(float t) { return std::ldexp(1.0f, pow2_ceil_exponent(t)); }

// |q| ≤ 6 onto the e2m1 grid, ties to the even code.
float round_to_e2m1(float q) { return fp4_e2m1_to_float(float_to_fp4_e2m1(q)); }

}  // namespace

void fake_quant_fp8_block32(float* x, std::int64_t n) {
  constexpr std::int64_t block = 32;
  if (n % block != 0) return;
  for (std::int64_t b = 0; b < n; b += block) {
    float amax = 0.0f;
    for (std::int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    amax = std::max(amax, 1e-4f);
    const float scale = pow2_ceil(amax * (1.0f / 448.0f));
    for (std::int64_t i = 0; i < block; ++i) {
      const float q = std::clamp(x[b + i] / scale, -448.0f, 448.0f);
      x[b + i] = round_to_e4m3(q) * scale;
    }
  }
}

void fake_quant_fp4_block(float* x, std::int64_t n, std::int64_t block, bool e4m3_scales) {
  if (block <= 0 || n % block != 0) return;
  for (std::int64_t b = 0; b < n; b += block) {
    float amax = 0.0f;
    for (std::int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    float scale;
    if (e4m3_scales) {
      scale = round_to_e4m3(std::max(amax, 6.0f * 0x1p-9f) / 6.0f);
    } else {
      scale = pow2_ceil(std::max(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
    }
    for (std::int64_t i = 0; i < block; ++i) {
      const float q = std::clamp(x[b + i] / scale, -6.0f, 6.0f);
      x[b + i] = round_to_e2m1(q) * scale;
    }
  }
}

void route_token(const text_config& c, float* scores, const float* bias,
                 std::vector<std::int64_t>& experts, std::vector<float>& weights) {
  const std::int64_t n = c.n_routed_experts;
  const auto temp = static_cast<float>(c.gate_temp);
  for (std::int64_t e = 0; e < n; ++e) scores[e] = scores[e] / temp;
  if (c.scoring_func == "sqrtsoftplus") {
    for (std::int64_t e = 0; e < n; ++e) {
      const float x = scores[e];
      scores[e] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
    }
  } else if (c.scoring_func == "sigmoid") {
    for (std::int64_t e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-scores[e]));
  } else {  // softmax
    float mx = scores[0];
    for (std::int64_t e = 1; e < n; ++e) mx = std::max(mx, scores[e]);
    float sum = 0.0f;
    for (std::int64_t e = 0; e < n; ++e) sum += scores[e] = std::exp(scores[e] - mx);
    for (std::int64_t e = 0; e < n; ++e) scores[e] /= sum;
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t e = 0; e < n; ++e) order[static_cast<std::size_t>(e)] = e;
  const std::int64_t k = std::min(c.num_experts_per_tok, n);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](std::int64_t a, std::int64_t b) {
                      const float sa = scores[a] + bias[a], sb = scores[b] + bias[b];
                      return sa != sb ? sa > sb : a < b;
                    });
  experts.assign(order.begin(), order.begin() + k);
  weights.resize(static_cast<std::size_t>(k));
  float total = 0.0f;
  for (std::int64_t e : experts) total += scores[e];
  for (std::int64_t i = 0; i < k; ++i) {
    float w = scores[experts[static_cast<std::size_t>(i)]];
    if (c.norm_topk_prob && k > 1) w = w / (total + 1e-20f);
    weights[static_cast<std::size_t>(i)] = w * static_cast<float>(c.routed_scaling_factor);
  }
}

}  // namespace troupe::kernels

#include "kernels/cpu_ops.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/portable_math.hpp"

namespace troupe::kernels {

void set_blas_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

std::string blas_kernel_name() { return openblas_get_corename(); }

namespace {

// The OPENBLAS_CORETYPE reexec_with_blas_kernel_upgrade sets, or "" to keep OpenBLAS's choice.
std::string blas_kernel_upgrade() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || blas_kernel_name() != "Prescott") return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

}  // namespace

void reexec_with_blas_kernel_upgrade(char** argv) {
  const std::string kernel = blas_kernel_upgrade();
  if (kernel.empty()) return;
  setenv("OPENBLAS_CORETYPE", kernel.c_str(), 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");
}

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
  for (std::int64_t i = 0; i < t.rope_dim / 2; ++i)
    portable::rope_pair(r, i, t.inv_freq[static_cast<std::size_t>(i)], pos, t.scaling, inverse);
}

float round_to_e4m3(float x) { return portable::round_to_e4m3(x); }

void fake_quant_fp8_block32(float* x, std::int64_t n) {
  constexpr std::int64_t block = 32;
  if (n % block != 0) return;
  for (std::int64_t b = 0; b < n; b += block) portable::quant_fp8_block(x + b, block);
}

void fake_quant_fp4_block(float* x, std::int64_t n, std::int64_t block, bool e4m3_scales) {
  if (block <= 0 || n % block != 0) return;
  for (std::int64_t b = 0; b < n; b += block) portable::quant_fp4_block(x + b, block, e4m3_scales);
}

portable::router_scoring router_scoring_of(const text_config& c) {
  return c.scoring_func == "sqrtsoftplus" ? portable::router_scoring::sqrtsoftplus
         : c.scoring_func == "sigmoid"    ? portable::router_scoring::sigmoid
                                          : portable::router_scoring::softmax;
}

void route_token(const text_config& c, float* scores, const float* bias,
                 std::vector<std::int64_t>& experts, std::vector<float>& weights) {
  const std::int64_t n = c.n_routed_experts, k = std::min(c.num_experts_per_tok, n);
  const auto f = router_scoring_of(c);
  experts.resize(static_cast<std::size_t>(k));
  weights.resize(static_cast<std::size_t>(k));
  portable::route_token(scores, bias, n, k, f, static_cast<float>(c.gate_temp), c.norm_topk_prob,
                        static_cast<float>(c.routed_scaling_factor), experts.data(),
                        weights.data());
}

}  // namespace troupe::kernels

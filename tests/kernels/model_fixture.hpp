// Test helpers for the CPU model: a random checkpoint for a config (every tensor model_tensors
// lists, fp32, seeded), and the relative error the parity tests bound.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>

#include "kernels/model.hpp"
#include "kernels/safetensors.hpp"

namespace troupe::kernels::testing {

/// max |a - b| / max |b| (0 when both are empty).
inline double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// Writes DIR/config.json (a copy of `config_path`) and DIR/model.safetensors with seeded
/// random fp32 weights: norms near 1, mHC scales 1, everything else small and centred.
inline std::filesystem::path write_random_model(const std::filesystem::path& config_path,
                                                const std::string& name, unsigned seed) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() /
                 ("troupe-test-model-" + std::to_string(::getpid()) + "-" + name);
  fs::create_directories(dir);
  fs::copy_file(config_path, dir / "config.json", fs::copy_options::overwrite_existing);
  auto cfg = load_model_config(dir);
  if (!cfg) throw std::runtime_error(cfg.error());
  std::mt19937 rng(seed);
  std::vector<tensor_to_write> tensors;
  for (const auto& spec : model_tensors(cfg->text)) {
    std::int64_t n = 1;
    for (auto d : spec.shape) n *= d;
    std::vector<float> v(static_cast<std::size_t>(n));
    const auto& nm = spec.name;
    const bool norm = nm.ends_with("norm.weight");
    const bool hc_scale = nm.ends_with("_scale");
    const float fan_in = spec.shape.size() == 2 ? float(spec.shape[1]) : 1.0f;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : v) {
      if (norm) x = 1.0f + 0.1f * normal(rng);
      else if (hc_scale) x = 1.0f + 0.1f * normal(rng);
      else if (nm.ends_with("embed.weight")) x = normal(rng);
      else if (spec.shape.size() == 2) x = normal(rng) / std::sqrt(fan_in);
      else x = 0.1f * normal(rng);
    }
    tensor_to_write t{nm, dtype::F32, spec.shape, {}};
    t.data.resize(v.size() * 4);
    std::memcpy(t.data.data(), v.data(), t.data.size());
    tensors.push_back(std::move(t));
  }
  auto written = write_safetensors(dir / "model.safetensors", tensors);
  if (!written) throw std::runtime_error(written.error());
  return dir;
}

}  // namespace troupe::kernels::testing

// Test helpers for the CPU model: a random checkpoint for a config (its released layout, seeded),
// and the relative error the parity tests bound.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "kernels/model.hpp"
#include "kernels/model_init.hpp"
#include "kernels/model_layout.hpp"
#include "kernels/safetensors.hpp"

namespace troupe::kernels::testing {

/// One forward call of one sequence; its logits (the test fails if the call does).
inline std::vector<float> run(const model& m, sequence_cache& cache, std::span<const std::int64_t> toks) {
  sequence_input in{&cache, toks};
  auto r = m.forward(std::span(&in, 1));
  REQUIRE_MESSAGE(r.ok(), r.error());
  return std::move(*r);
}

/// max |a - b| / max |b| (0 when both are empty).
inline double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// Writes DIR/config.json (a copy of `config_path`) and DIR/model.safetensors with every tensor
/// of the config's released layout, random and seeded (kernels/model_init's generator).
inline std::filesystem::path write_random_model(const std::filesystem::path& config_path,
                                                const std::string& name, unsigned seed) {
  namespace fs = std::filesystem;
  fs::path dir =
      fs::temp_directory_path() / ("troupe-test-model-" + std::to_string(::getpid()) + "-" + name);
  fs::create_directories(dir);
  fs::copy_file(config_path, dir / "config.json", fs::copy_options::overwrite_existing);
  auto cfg = load_model_config(dir);
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  std::vector<tensor_to_write> tensors;
  for (const auto& spec : released_layout(*cfg))
    for (auto& t : generate_weight(spec, seed).stored) tensors.push_back(std::move(t));
  auto written = write_safetensors(dir / "model.safetensors", tensors);
  REQUIRE_MESSAGE(written.ok(), written.error());
  return dir;
}

}  // namespace troupe::kernels::testing

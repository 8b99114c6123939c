// Test helpers for the CPU model: a random checkpoint for a config (its released layout, seeded),
// and the relative error the parity tests bound.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "kernels/model.hpp"
#include "kernels/model_init.hpp"
#include "kernels/model_layout.hpp"
#include "kernels/safetensors.hpp"
#include "scratch.hpp"

namespace troupe::kernels::testing {

/// One forward call of one sequence; its logits (the test fails if the call does).
inline std::vector<float> run(const model& m, sequence_cache& cache, std::span<const std::int64_t> toks) {
  sequence_input in{&cache, toks};
  auto r = m.forward(std::span(&in, 1));
  REQUIRE_MESSAGE(r.ok(), r.error());
  return std::move(*r);
}

/// `n` token ids in [3, vocab), drawn from `seed` (a fixed linear congruential sequence).
inline std::vector<std::int64_t> prompt(std::size_t n, std::uint32_t seed, std::int64_t vocab) {
  std::vector<std::int64_t> t(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = std::int64_t(3 + (x >> 8) % std::uint32_t(vocab - 3));
  }
  return t;
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

/// Why the parity tests' inputs can be trusted on every CPU and BLAS kernel.
///
/// Two correct fp32 implementations (ours on any OpenBLAS kernel, the reference on torch) sum
/// in different orders and differ by ~1e-6 relative. That is harmless for smooth functions, but
/// the model also makes discrete decisions: FP8 / FP4 quantiser steps and scales, router and
/// indexer top-k, argmax. An input whose decision sits within ~1e-6 of its boundary flips
/// between kernels and moves the logits by ~1e-3 — a golden comparison at 1e-4 then fails on
/// some machines and passes on others without either side being wrong.
///
/// The probe: run the same computation with `model_options::jitter` = 1e-6 (about ten times a
/// projection's summation-order difference between kernels, applied to every projection's
/// output) under three seeds and return the largest relative change of the outputs
/// (`changed_decision` is set if any exact output, a token, changed). A golden input is usable
/// at tolerance τ only when that stays well under τ: its decisions are then farther from their
/// boundaries than any kernel's rounding reaches, so both implementations took the same ones.
/// The parity tests assert it before comparing; the golden scripts (tools/model_golden.py,
/// tools/dspark_golden.py) choose inputs that pass a four times stronger jitter over six seeds.
/// (At 1e-6 the DSpark golden's earlier 40-token prompt, the one that failed under OpenBLAS's
/// SkylakeX and Prescott kernels, moves by 1.3e-3; the prompt that replaced it by 3e-6.)
struct jitter_probe {
  double worst_relative_change = 0.0;
  bool changed_decision = false;
};
constexpr double probe_jitter = 1e-6;

/// `compute(options)` returns the floats to compare and the discrete outputs (may be empty).
template <class Compute>
jitter_probe probe_stability(model_options base, Compute compute) {
  const auto [ref_values, ref_exact] = compute(base);
  jitter_probe p;
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    model_options o = base;
    o.jitter = probe_jitter;
    o.jitter_seed = seed;
    const auto [values, exact] = compute(o);
    p.worst_relative_change = std::max(p.worst_relative_change, relative_error(values, ref_values));
    p.changed_decision = p.changed_decision || exact != ref_exact;
  }
  return p;
}

/// Asserts, before a comparison at relative `tolerance`, that its inputs are stable under the
/// probe: the outputs move by at most tolerance / 2 and no exact output changes. The other
/// half covers the difference being tested (a summation order, or the other implementation).
template <class Compute>
void require_stable_inputs(model_options base, Compute compute, double tolerance) {
  const auto p = probe_stability(base, compute);
  MESSAGE("outputs move by " << p.worst_relative_change << " under a " << probe_jitter
                             << " jitter");
  REQUIRE_MESSAGE(p.worst_relative_change <= tolerance / 2,
                  "an input sits on a decision boundary: choose other inputs");
  REQUIRE_MESSAGE(!p.changed_decision, "an exact output is a near-tie: choose other inputs");
}

/// Writes DIR/config.json (a copy of `config_path`) and DIR/model.safetensors with every tensor
/// of the config's released layout, random and seeded (kernels/model_init's generator).
inline std::filesystem::path write_random_model(const std::filesystem::path& config_path,
                                                const std::string& name, unsigned seed) {
  namespace fs = std::filesystem;
  fs::path dir =
      scratch_root() / ("model-" + name);
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

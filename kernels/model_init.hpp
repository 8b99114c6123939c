// Random DeepSeek-V4.1 model directories (`troupe model init`).
//
// Tests, benches and `troupe generate` need a model directory that has the released layout
// without the 300 GB of the released weights: a config.json the config parser accepts and
// safetensors files with every tensor of kernels/model_layout under its released name, in the
// released storage formats (FP8 block-scaled dense weights, packed FP4 experts, F32 mHC
// parameters, an Engram table), sharded with model.safetensors.index.json when large. Values
// are random but reproducible: each element is a pure function of (seed, tensor name, index),
// so a tensor can be regenerated alone (generate_weight) to check what was written.
//
// Presets: `tiny` (6 layers, hidden 32, vocab 256: sliding, ratio-2 and ratio-1 layers, two KV
// sources, a Reindex source inside the candidate top-k, Engram on one layer, one file) and
// `small` (about 107M parameters, V4.1-shaped: the released vocabulary of 129,280, 8 layers
// [0, 2, 2, 2, 1, 1, 1, 1], 16 experts top-4 + shared, Engram, sliding window 128, YaRN on the
// compress rope; several shards). Both carry DSpark draft layers (`mtp.*`: two stages in tiny,
// one in small), written like every other tensor of the layout.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/model_config.hpp"
#include "kernels/model_layout.hpp"
#include "kernels/result.hpp"
#include "kernels/safetensors.hpp"

namespace troupe::kernels {

/// The config.json text of a preset ("tiny" or "small").
result<std::string> preset_config_json(std::string_view preset);

/// One weight as written: its stored tensors (the weight, and its `.scale` companion when
/// quantized) and the float32 values a loader must recover (dequantized), row-major.
struct generated_weight {
  std::vector<tensor_to_write> stored;
  std::vector<float> values;
};

/// The weight `spec` of a model initialised with `seed`: random values with per-kind
/// magnitudes (norm weights near 1, projections ~ 1/sqrt(fan_in), ...) quantized to its format.
generated_weight generate_weight(const weight_spec& spec, std::uint64_t seed);

/// What write_random_model wrote.
struct init_summary {
  std::vector<std::filesystem::path> files;  // config.json, shards, index
  std::uint64_t parameters = 0;              // logical elements of every weight
  std::uint64_t bytes = 0;                   // bytes of the safetensors files
};

/// Writes config.json and the weights of `preset` with `seed` into `dir` (created if needed;
/// existing files of the same names are replaced). Shards hold at most `shard_bytes` each
/// (a single model.safetensors when everything fits in one).
result<init_summary> write_random_model(const std::filesystem::path& dir, std::string_view preset,
                                        std::uint64_t seed, std::uint64_t shard_bytes = 96ull << 20);

}  // namespace troupe::kernels

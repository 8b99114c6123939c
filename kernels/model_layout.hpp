// Every tensor a DeepSeek-V4.1 checkpoint holds, by its released name, for a given config.
//
// The released checkpoint names its tensors after the reference modules without the `model.`
// prefix (`embed.weight`, `layers.N.attn.wq_a.weight`, `layers.N.ffn.experts.E.w1.weight`,
// `head.weight`), and which tensors exist depends on the config: only KV-source layers own a
// compressor, only index sources an indexer (and only those that are also KV sources its key
// projection), only Engram layers a table. A loader must know the whole list to refuse a
// checkpoint that lacks a tensor, and `troupe model init` to write one. The list here is checked
// against the tensors of the transformers reference for the tiny golden configs
// (tests/kernels/golden/model/*/golden.json). The DSpark draft layers (`mtp.<stage>.*`, when
// num_nextn_predict_layers > 0) follow the names public serving engines load from the released
// checkpoint (vLLM / vLLM-Ascend / SGLang DSpark loaders); the transformers reference ignores
// `mtp.*`, so these names and shapes are not checked against it (docs/model.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/model_config.hpp"
#include "kernels/safetensors.hpp"

namespace troupe::kernels {

/// How a tensor is stored in the checkpoint.
enum class weight_format {
  bf16,        // BF16
  f32,         // F32 (the mHC parameters, attention sinks, router biases)
  fp8_block,   // F8_E4M3 + `<base>.scale` F8_E8M0, one scale per block (weight_spec::block_*)
  fp4_expert,  // packed E2M1 in I8 [out, in/2] + `<base>.scale` F8_E8M0 [out, in/32]
  fp8_table,   // Engram table: F8_E4M3 [rows, dim] with `<base>.scale` F8_E8M0 [rows, dim/32]
  e8m0,        // F8_E8M0 (the Engram table's scales, listed as their own tensor)
};

/// One tensor of the layout: its released name, its logical shape (the dequantized shape of
/// a quantized weight) and its storage format.
struct weight_spec {
  std::string name;
  std::vector<std::int64_t> shape;
  weight_format format = weight_format::bf16;
  // fp8_block only: the scale block, `quantization_config.weight_block_size` (32 x 32 in V4.1).
  std::int64_t block_rows = 128, block_cols = 128;
};

/// The name of a storage format ("bf16", "f32", "fp8_block", ...).
const char* format_name(weight_format f);

/// Every tensor of the backbone (embedding, layers, final norm, head) for `cfg`, in a fixed
/// order. Dense projections are fp8_block when cfg has an FP8 quantization_config, routed
/// experts fp4_expert when expert_dtype is "fp4"; everything else as the released checkpoint
/// stores it. Quantized weights' `.scale` companions are implied, not listed (except the
/// Engram table's, which the reference holds as a parameter of its own).
std::vector<weight_spec> released_layout(const model_config& cfg);

/// A tensor as the checkpoint stores it: name, dtype and stored shape.
struct stored_tensor {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::int64_t> shape;
};

/// What the checkpoint holds for one weight of the layout: the weight in its storage dtype and
/// shape (packed FP4 [out, in/2] I8), then its `.scale` companion when the format has one (FP8
/// blocks [ceil(out/block_rows), ceil(in/block_cols)], FP4 [out, in/32], both F8_E8M0).
std::vector<stored_tensor> stored_tensors(const weight_spec& spec);

/// The Engram bucket layout of the reference: for each Engram layer, for each n-gram size
/// 2..max_ngram_size, engram_n_heads primes, each the next prime above engram_vocab_size - 1
/// not used before (anywhere in the model). Returns the primes per layer, flattened over
/// (n-gram size, head); a layer's table has the sum of its primes as its row count.
std::vector<std::vector<std::int64_t>> engram_primes(const text_config& t);

}  // namespace troupe::kernels

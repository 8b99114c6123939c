// The device-memory plan of one GPU rank: the weights it holds, by layer and storage format,
// and how many Block KV blocks fit in what is left.
//
// A GPU loads its share of the checkpoint as the checkpoint stores it (BF16, F32, FP8 with
// per-128×128-block scales, packed FP4 experts with per-32 scales), every dense tensor on every
// rank and only its own routed experts under expert parallelism; the Engram tables (~200 GB in
// the released model) stay in host memory, memory-mapped from local SSD. What remains of the
// free HBM after the weights, a reserve (activations, the cuBLASLt workspace, NCCL buffers) and
// the sequences' SWA rings becomes the pool of 128-token Block KV blocks. Computing this before
// allocating anything turns "the model does not fit" into a message with the figures instead of
// an out-of-memory error halfway through loading. A pure function of the config and the
// options (tests run it on the CPU).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/ep_dispatch.hpp"
#include "kernels/model_config.hpp"
#include "kernels/model_layout.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels {

/// Storage formats in weight_format order (bf16, f32, fp8_block, fp4_expert, fp8_table, e8m0).
inline constexpr std::size_t weight_format_count = 6;

/// Bytes a tensor occupies as the checkpoint stores it, its scales included: bf16 2 / f32 4
/// per element, fp8_block 1 per element + 1 per started scale block, fp4_expert 1/2 per
/// element + 1 per 32, fp8_table 1 per element + 1 per 32, e8m0 1 per element.
std::int64_t stored_bytes(const weight_spec& w);

struct device_layout_options {
  /// Free device memory before loading (cudaMemGetInfo's `free`).
  std::int64_t free_bytes = 0;
  /// Kept free for activations, the GEMM workspace and NCCL buffers.
  std::int64_t reserve_bytes = std::int64_t{4} << 30;
  /// Sequences whose SWA rings are reserved up front.
  std::int64_t max_sequences = 256;
  /// Under EP: this rank and the placement (null: every routed expert on this GPU). The draft
  /// layers' experts are held on every rank.
  std::int32_t ep_rank = 0;
  const expert_placement* placement = nullptr;
  /// Bytes per stored cache value: 4 keeps Block KV and SWA rows as fp32 values on the
  /// quantisers' grids, as the CPU backend's caches do.
  std::int64_t kv_value_bytes = 4;
  std::int64_t swa_value_bytes = 4;
};

/// One layer's weights on the device, by storage format.
struct layer_weights {
  /// -1: embedding, final norm and LM head; 0..L-1: backbone layers; L..: draft stages.
  std::int64_t layer = -1;
  std::array<std::int64_t, weight_format_count> bytes{};
  std::int64_t total() const;
};

struct device_layout {
  std::vector<layer_weights> layers;  // -1 first, then layer order
  std::array<std::int64_t, weight_format_count> weight_bytes_by_format{};
  std::int64_t weight_bytes = 0;      // on the device
  std::int64_t host_bytes = 0;        // Engram tables and their scales, kept in host memory
  std::int64_t swa_bytes_per_sequence = 0;  // every layer's (window + 6)-row ring
  std::int64_t swa_bytes = 0;               // max_sequences of them
  std::int64_t kv_block_bytes = 0;    // one 128-token block over every KV-source layer
  std::int64_t kv_blocks = 0;         // the Block KV pool
  std::int64_t kv_pool_bytes = 0;
};

/// The plan for `cfg` under `o`. Errors: a placement whose expert count is not the model's or
/// whose ranks do not include ep_rank, or weights + reserve + SWA rings above free_bytes (the
/// message gives each figure in GiB).
result<device_layout> plan_device_layout(const model_config& cfg, const device_layout_options& o);

}  // namespace troupe::kernels

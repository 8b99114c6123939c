// The three KV cache layers of a sequence as byte strings (docs/model.md, "The KV cache layers"):
//
//   - Block KV: what the KV-source layers publish — compressed / shared KV latents and indexer
//     keys — for one full 128-token block of the sequence, all KV-source layers together. The
//     format the persistent store holds: values are packed back onto the grids the forward pass
//     rounded them to (FP4 e2m1 codes with an e4m3 scale per 16 channels for the KV latents, FP4
//     with a power-of-two scale per 32 for the indexer keys); a tensor whose values are not on
//     that grid (a width the quantiser skips) is stored as fp32. Restores bit-exactly.
//   - State KV: everything of the unfinished block — the sequence length, the compressor's
//     pending and recent rows, the latents and keys of the block's completed groups, the Engram
//     look-back.
//   - SWA KV: every layer's sliding-window ring (window + 6 rows, the rows of the positions it
//     holds).
//
// Every string is framed as: 4-byte magic, u32 version, u64 payload size, the payload, and the
// XXH3-64 of everything before it. Restoring checks the frame, the checksum and every shape
// against the cache it restores into; corrupt, truncated or mismatched bytes are refused as
// values and leave the cache as it was.
//
// A sequence's cache equals, bit for bit, a fresh cache of the same model restored with its Block
// KV blocks 0..n-1 in order, then its State KV, then its SWA KV.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kernels/kv_cache.hpp"
#include "kernels/model.hpp"
#include "kernels/model_config.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels {

/// Full 128-token blocks of `s` (every KV-source layer holds them completely).
std::int64_t full_blocks(const sequence_cache& s);

/// Block KV block `block` (< full_blocks(s)) of every KV-source layer.
result<std::string> serialize_block(const sequence_cache& s, std::int64_t block);
/// One KV-source layer's rows of a Block KV block: `rows` adjacent rows of its compressed KV
/// (`width` values each) and, when it owns indexer keys, of those (`key_width`; 0 and null
/// when it owns none).
struct block_layer_rows {
  std::uint32_t layer = 0, ratio = 0;
  std::int64_t rows = 0, width = 0, key_width = 0;
  const float* kv = nullptr;
  const float* keys = nullptr;
};
/// What serialize_block writes for block `block`, from each KV-source layer's rows of it in
/// layer order: the same bytes for a cache that lives elsewhere (a CUDA device's, which reads
/// only the block's rows).
std::string serialize_block_rows(std::int64_t block, std::span<const block_layer_rows> layers);
/// Appends Block KV block `block` to `s`, whose KV-source layers must hold exactly `block` full
/// blocks and nothing of a later one (blocks are restored in order, before the State KV).
result<bool> restore_block(sequence_cache& s, std::int64_t block, std::string_view bytes);

/// The State KV of `s`.
result<std::string> serialize_state(const sequence_cache& s);
/// Restores the State KV into `s`, which must hold exactly the full blocks the state's length
/// implies (restored with restore_block) and nothing else.
result<bool> restore_state(sequence_cache& s, std::string_view bytes);

/// The SWA KV of `s`.
result<std::string> serialize_swa(const sequence_cache& s);
/// Replaces every layer's window ring of `s` by the serialised one.
result<bool> restore_swa(sequence_cache& s, std::string_view bytes);

/// A sequence's DSpark draft context (every draft stage's window ring), framed like the SWA KV
/// ("TKVD"): what a device that continues the sequence needs to draft as this one would.
std::string serialize_draft(const draft_state& d);
/// Replaces the rings of `d` (made by the same model: its stages' shapes) by the serialised
/// ones. Errors (another shape, corrupt or truncated bytes) leave `d` as it was.
result<bool> restore_draft(draft_state& d, std::string_view bytes);

/// The size in bytes of one serialised full Block KV block of a model with config `c`, when
/// every tensor packs onto its grid (those whose width the quantiser covers).
std::int64_t block_kv_bytes(const text_config& c);

}  // namespace troupe::kernels

// The DeepSeek-V4.1 forward pass on the device: the CPU engine's layer loop (kernels/model.cpp)
// run as kernels of ops.hpp and FP32 GEMMs (lt_gemm::run_f32), with each sequence's SWA rings,
// compressed KV and indexer keys in device memory. The first piece of the CUDA backend that
// computes logits.
//
// What it runs: every V4.1 layer type of the backbone — sliding-window attention, CSA2
// compressed layers (the compressor's groups, the indexer's top-k over the key owner's keys with
// the candidate source's block mask, attention over the window and the selected compressed
// entries) and Engram (table rows read on the host: the tables stay in the mapped checkpoint, as
// they must at full scale), with mHC and the MoE; a sequence's cache moves to and from the CPU
// engine's form (export_sequence / import_sequence), so the KV block formats, bounded replay
// and the encoder–decoder prefill reach the device through the CPU engine; batch-invariant
// mode; rollback of a rejected draft; the DSpark draft features and draft layers (each
// sequence's draft context in device memory beside its rings). Weights are the CPU engine's fp32
// copies (`model::tensors()`), not the checkpoint's BF16 / FP8 / FP4 bytes, so memory is 4
// bytes per parameter: a check of the layer loop on small models, not a way to fit V4.1-Flash
// on a GPU. The compressed KV and indexer keys live in pages of a pool all sequences share
// (kernels/cuda/paging.hpp): a sequence takes a page per page_tokens tokens as it grows and
// gives them back when closed.
// The routed experts run one GEMM per expert on the rows the host's dispatch plan groups for
// it (kernels/ep_dispatch.hpp, one rank), which needs the router's choices on the host once
// per layer; the indexer runs per sequence.
//
// This file is plain C++ over device pointers. troupe_cuda builds it with the CUDA runtime and
// cuBLASLt; tests/cuda_host builds it with host memory and the kernels under the SIMT emulator
// (tests/cuda_host/emulated_device.cpp), so the whole forward pass is checked against the CPU
// engine in every test run, and on a GPU by bench/gpu_check.sh.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/ep_dispatch.hpp"
#include "kernels/model.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

struct device_model_options {
  /// Sequences open at once (their SWA rings are allocated up front).
  std::int64_t max_sequences = 16;
  /// Tokens a sequence may hold.
  std::int64_t max_context = 4096;
  /// Context tokens a page of compressed KV holds (a multiple of every compressor's ratio; in
  /// a store of ratio r a page is page_tokens / r rows).
  std::int64_t page_tokens = 256;
  /// Tokens the page pool holds, all sequences together (rounded up to whole pages); 0: as
  /// many as the device's memory has room for (memory_fraction), and at most max_sequences ×
  /// max_context, so that no sequence within max_context ever lacks a page.
  std::int64_t kv_tokens = 0;
  /// With kv_tokens 0: the share of the device's total memory this model may fill, its
  /// weights, rings, page pool and a call's work included (vLLM's gpu_memory_utilization).
  /// The share is its own: what other processes or models hold does not count against it
  /// (models sharing a GPU each take their fraction), but the pool takes only free memory.
  double memory_fraction = 0.9;
  /// With kv_tokens 0: bytes of that share left free for a call's activations and logits
  /// (allocated per call, with the GEMM's workspace).
  std::int64_t work_bytes = std::int64_t{1} << 30;
  /// Batch-invariant mode: every projection runs project_rows (a fixed summation order per
  /// output) instead of cuBLASLt, whose algorithm depends on the row count; a sequence's logits
  /// are then bitwise the same whatever shares its batch and however its prefill is chunked.
  /// Far slower.
  bool batch_invariant = false;
};

class device_model {
 public:
  /// The weights of a loaded CPU model copied to the device, and empty rings. The model must
  /// outlive the device model (its Engram tables and token map are read at each call). Errors:
  /// max_sequences, max_context or page_tokens < 1, pages that do not hold whole compressor
  /// groups, kv_tokens < 0, memory_fraction outside (0, 1], a window (plus index_topk selected
  /// entries) longer than the attention kernel takes, a pool sized from memory too small for
  /// one sequence of max_context (the message gives the figures), a failed allocation or copy.
  static result<device_model> upload(const model& m, const device_model_options& options = {});

  device_model(device_model&&) noexcept;
  device_model& operator=(device_model&&) noexcept;
  ~device_model();

  /// A new, empty sequence. Errors: max_sequences already open.
  result<sequence_id> open_sequence();
  /// Frees a sequence's rings and pages. Errors: an unknown id.
  result<bool> close_sequence(sequence_id id);
  /// Tokens processed so far by a sequence.
  result<std::int64_t> length(sequence_id id) const;
  /// Pages of the pool, and its context tokens (pages × page_tokens).
  std::int64_t pages() const;
  std::int64_t kv_tokens() const;
  /// Device bytes a page takes over every store (each KV source's compressed KV, each key
  /// owner's indexer keys).
  std::int64_t page_bytes() const;
  /// Pages of the pool no sequence holds.
  std::int64_t free_pages() const;
  /// Pages a sequence of `tokens` tokens holds.
  std::int64_t pages_for(std::int64_t tokens) const;
  /// Pages sequence `id` takes from the pool to hold `tokens` tokens. Errors: an unknown id.
  result<std::int64_t> pages_to_grow(sequence_id id, std::int64_t tokens) const;
  /// model::set_expert_placement's expert-parallel evaluation: each MoE runs the placement's
  /// ranks one after another on this device (the grouping an EP group would compute, on one
  /// GPU), each token's copies combined in top-k slot order as without one; in batch-invariant
  /// mode the logits are bitwise those without a placement. std::nullopt: one rank again.
  /// Errors: check_placement's.
  result<bool> set_expert_placement(std::optional<expert_placement> placement);
  /// Tokens routed to each routed expert so far, summed over the MoEs (model::expert_counts).
  std::vector<std::uint64_t> expert_counts() const;
  /// Full 128-token blocks of a sequence's compressed KV (kernels::full_blocks of its export),
  /// without downloading anything.
  result<std::int64_t> full_blocks(sequence_id id) const;
  /// serialize_block of a full block of a sequence (the bytes of kernels/kv_blocks.hpp, equal to
  /// those of its export_sequence), downloading only that block's rows: what persisting the
  /// blocks a decode fills costs per block, whatever the context. Errors: an unknown id, a
  /// block that is not full (serialize_block's words).
  result<std::string> export_block(sequence_id id, std::int64_t block) const;

  /// A sequence's cache as the CPU engine holds it (kernels/kv_cache.hpp: window rings,
  /// compressed KV, indexer keys, unfinished groups, Engram look-back), downloaded: a CPU model
  /// continues it exactly as this device would, and kernels/kv_blocks.hpp serialises it, so a
  /// sequence moves between GPU and CPU instances in the same Block / State / SWA KV bytes. It
  /// cannot be rolled back below its length (the recent rows before its unfinished group stay
  /// behind).
  result<sequence_cache> export_sequence(sequence_id id) const;
  /// A new sequence continuing `cache` (made by the same CPU model: fresh, computed, restored
  /// from serialised KV, or after a bounded replay). Errors: another model's cache, a cache
  /// longer than max_context, fewer free pages than it takes, max_sequences already open.
  result<sequence_id> import_sequence(const sequence_cache& cache);

  /// As model::forward: each sequence's tokens continue from its rings (prefill, chunked
  /// prefill and decode in one batch), logits [total tokens, vocab], sequences in batch order.
  /// Errors (an unknown or repeated id, a token out of range, a sequence past max_context, fewer
  /// free pages than the call's tokens take, an Engram model without its token map) leave every
  /// sequence as it was; a device failure
  /// halfway leaves the batch's sequences unusable (close them).
  /// `dspark_features`, when given, receives every token's DSpark draft features [T, target
  /// layers, hidden] (model::forward's).
  result<std::vector<float>> forward(std::span<const step_input> batch,
                                     std::vector<float>* dspark_features = nullptr);
  /// Undoes a sequence's last k <= 6 tokens (a rejected draft), as kernels::rollback does to a
  /// CPU cache: afterwards it continues as if it never ran them. Only tokens run since it was
  /// opened or imported, or since its previous rollback, can be undone. Errors: an unknown id,
  /// k < 0 or k > 6, k beyond those tokens.
  result<bool> rollback(sequence_id id, std::int64_t k);

  /// Whether the model has DSpark draft layers (uploaded with the rest).
  bool has_draft() const;
  /// model_backend::draft on the device: each request's features (rows of forward's
  /// `dspark_features` for the tokens its sequence kept, the first at `position`) join the
  /// sequence's draft context, which restarts empty at `position` when it does not end there
  /// (or the sequence has none yet); then the DSpark blocks of the requests with an anchor run
  /// through the draft stages on the device, and the Markov bias, argmax and confidence of
  /// model::finish_draft on the host. Errors (no draft layers, an unknown or repeated id,
  /// features of the wrong width, an anchor out of range, a negative position) change no
  /// context.
  result<draft_output> draft(std::span<const draft_request> batch);
  /// A sequence's draft context as the CPU engine holds one (kernels/kv_blocks.hpp's
  /// serialize_draft writes it); std::nullopt when it has none. Errors: an unknown id.
  result<std::optional<draft_state>> export_draft(sequence_id id) const;
  /// Sets a sequence's draft context from one of the uploaded model (export_draft's, or the
  /// CPU engine's). Errors: an unknown id, another model's state, stages of unequal extent.
  result<bool> import_draft(sequence_id id, const draft_state& context);

  struct state;

 private:
  explicit device_model(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

}  // namespace troupe::kernels::cuda

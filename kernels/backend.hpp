// The calls a GPU rank makes on its model, as an interface a CUDA backend can implement later;
// `cpu_backend` implements it with the exact CPU model (kernels/model.hpp).
//
// A backend owns the caches of the sequences it serves, named by ids it hands out. One `step`
// runs a batch in which each sequence brings new tokens — a prompt (prefill), the rest of a
// prompt (chunked prefill) or one or a few tokens (decode) — and returns every token's logits.
// The Block KV of a full 128-token block crosses ranks and the persistent store as the byte
// string of kernels/kv_blocks.hpp, so a CUDA backend must read and write that same format.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/model.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels {

using sequence_id = std::uint64_t;

/// One sequence's share of a step.
struct step_input {
  sequence_id sequence = 0;
  std::span<const std::int64_t> tokens;
};

/// One sequence's share of a draft call (model::draft): the DSpark features of the tokens it
/// kept since its last draft call, the first of them at `position`, and the anchor (its next
/// token, at position + rows); an anchor < 0 only appends the features to the sequence's draft
/// context (a prefill chunk before the prompt's last: model::extend_draft) and drafts nothing.
struct draft_request {
  sequence_id sequence = 0;
  std::int64_t position = 0;
  std::span<const float> features;
  std::int64_t anchor = 0;
};

class model_backend {
 public:
  virtual ~model_backend() = default;

  /// A new, empty sequence.
  virtual sequence_id open_sequence() = 0;
  /// Frees a sequence's cache. Errors: an unknown id.
  virtual result<bool> close_sequence(sequence_id id) = 0;
  /// Tokens processed so far by a sequence.
  virtual result<std::int64_t> length(sequence_id id) const = 0;

  /// Prefill / decode over a batch (each sequence at most once): logits [total tokens, vocab],
  /// sequences in batch order. Errors (unknown id, bad token) leave every cache as it was.
  virtual result<std::vector<float>> step(std::span<const step_input> batch) = 0;
  /// As step, but the logits of each sequence's last rows[s] tokens only: [sum of rows,
  /// vocab] (1: the next token's; 1 + k: a verify step's k drafts and the token after them).
  /// `dspark_features`, when given, receives every token's DSpark draft features.
  virtual result<std::vector<float>> step_tail(std::span<const step_input> batch,
                                               std::span<const std::int64_t> rows,
                                               std::vector<float>* dspark_features) = 0;
  /// Undoes a sequence's last k <= 6 tokens (a rejected draft).
  virtual result<bool> rollback(sequence_id id, std::int64_t k) = 0;
  /// Whether the model has DSpark draft layers.
  virtual bool has_draft() const = 0;
  /// DSpark drafts for a batch of sequences (model::draft), in batch order for the requests
  /// with an anchor. The backend keeps each sequence's draft context (freed with the
  /// sequence); a context that does not end at a request's `position` (a sequence whose
  /// earlier features it never saw) restarts there, empty.
  virtual result<draft_output> draft(std::span<const draft_request> batch) = 0;
  /// A sequence's draft context (kv_blocks.hpp's serialize_draft); empty when it has none.
  virtual result<std::string> export_draft(sequence_id id) const = 0;
  /// Sets a sequence's draft context from export_draft's bytes (of the same model).
  virtual result<bool> import_draft(sequence_id id, std::string_view bytes) = 0;

  /// The serialised Block KV of a full block of a sequence.
  virtual result<std::string> export_block(sequence_id id, std::int64_t block) const = 0;
  /// Appends a serialised Block KV block to a sequence (blocks in order, before anything else).
  virtual result<bool> import_block(sequence_id id, std::int64_t block,
                                    std::string_view bytes) = 0;
  /// Full 128-token blocks of a sequence's Block KV (the blocks export_block serialises).
  virtual result<std::int64_t> full_blocks(sequence_id id) const = 0;
  /// The serialised State KV of a sequence (kernels/kv_blocks.hpp).
  virtual result<std::string> export_state(sequence_id id) const = 0;
  /// The serialised SWA KV of a sequence.
  virtual result<std::string> export_swa(sequence_id id) const = 0;
  /// Restores a sequence's State KV after its imported blocks (exactly the full blocks the
  /// state's length implies); the sequence then holds that length. Errors leave it as it was.
  virtual result<bool> import_state(sequence_id id, std::string_view bytes) = 0;
  /// Replaces a sequence's SWA KV. A fresh sequence given blocks 0..n-1, then the State KV,
  /// then the SWA KV of an exported one continues exactly as the exported one would.
  virtual result<bool> import_swa(sequence_id id, std::string_view bytes) = 0;
  /// Rebuilds a sequence holding only imported blocks from its tokens by bounded replay;
  /// returns the next token's logits.
  virtual result<std::vector<float>> replay(sequence_id id,
                                            std::span<const std::int64_t> tokens) = 0;
  /// Tokens routed to each routed expert so far, summed over the main layers' MoEs
  /// (model::expert_counts): what the expert-parallel load balancer places by.
  virtual std::vector<std::uint64_t> expert_counts() const = 0;
  /// Runs the MoEs by an expert placement from the next step on (model::set_expert_placement);
  /// std::nullopt: as one group. Errors: a placement that does not fit the model.
  virtual result<bool> set_expert_placement(std::optional<expert_placement> placement) = 0;
  /// Sequences moved out of device memory to make room so far (a GPU backend whose steps need
  /// more sequences than it holds at once); 0 where every sequence stays where it is.
  virtual std::uint64_t evictions() const { return 0; }
  /// Why the backend can serve nothing more (an EP group whose rank failed); empty while it
  /// can. A device whose backend says so stops, so that its instance re-forms.
  virtual std::string broken() const { return {}; }
};

/// The DSpark draft contexts of a backend's sequences and the draft calls over them, on the CPU
/// model (cpu_backend's). The backend checks that a sequence is its own before each call.
class draft_contexts {
 public:
  /// model_backend::draft over `m`.
  result<draft_output> draft(const model& m, std::span<const draft_request> batch);
  /// model_backend::export_draft: empty when the sequence has no context.
  std::string export_draft(sequence_id id) const;
  /// model_backend::import_draft.
  result<bool> import_draft(const model& m, sequence_id id, std::string_view bytes);
  /// Forgets a sequence's context (closed).
  void erase(sequence_id id) { states_.erase(id); }

 private:
  std::map<sequence_id, draft_state> states_;
};

/// Makes a backend from a loaded model (a device port's choice of engine:
/// ports::cpu_device_params::backend).
using backend_opener = std::function<result<std::unique_ptr<model_backend>>(model)>;

/// The exact CPU backend.
class cpu_backend final : public model_backend {
 public:
  explicit cpu_backend(model m) : model_(std::move(m)) {}

  const model& cpu_model() const { return model_; }
  model& cpu_model() { return model_; }

  sequence_id open_sequence() override;
  result<bool> close_sequence(sequence_id id) override;
  result<std::int64_t> length(sequence_id id) const override;
  result<std::vector<float>> step(std::span<const step_input> batch) override;
  result<std::vector<float>> step_tail(std::span<const step_input> batch,
                                       std::span<const std::int64_t> rows,
                                       std::vector<float>* dspark_features) override;
  result<bool> rollback(sequence_id id, std::int64_t k) override;
  bool has_draft() const override;
  result<draft_output> draft(std::span<const draft_request> batch) override;
  result<std::string> export_draft(sequence_id id) const override;
  result<bool> import_draft(sequence_id id, std::string_view bytes) override;
  result<std::string> export_block(sequence_id id, std::int64_t block) const override;
  result<bool> import_block(sequence_id id, std::int64_t block, std::string_view bytes) override;
  result<std::int64_t> full_blocks(sequence_id id) const override;
  result<std::string> export_state(sequence_id id) const override;
  result<std::string> export_swa(sequence_id id) const override;
  result<bool> import_state(sequence_id id, std::string_view bytes) override;
  result<bool> import_swa(sequence_id id, std::string_view bytes) override;
  result<std::vector<float>> replay(sequence_id id,
                                    std::span<const std::int64_t> tokens) override;
  std::vector<std::uint64_t> expert_counts() const override { return model_.expert_counts(); }
  result<bool> set_expert_placement(std::optional<expert_placement> placement) override {
    return model_.set_expert_placement(std::move(placement));
  }

 private:
  model model_;
  sequence_id next_ = 1;
  std::map<sequence_id, sequence_cache> sequences_;
  draft_contexts drafts_;
};

}  // namespace troupe::kernels

// The device port: how a GPU rank actor runs a step of model compute.
//
// A gpu_rank actor never touches a GPU or a clock itself: it sends a `device_step` to its
// device port and gets a `device_result` back as an ordinary reply. In the simulated world
// the port is an actor that replies after a modelled duration; in the real world it runs CPU
// (OpenBLAS) or CUDA kernels. Both implement `device_port`, so the rank cannot tell them
// apart. A device runs one step at a time: steps queue in arrival order.
//
// The prefill -> decode hand-off moves a sequence between devices: `kv_export` on the prefill
// device answers a `kv_snapshot` (the sequence's KV as the byte formats of kernels/kv_blocks.hpp)
// by handle, and `kv_import` on the decode device restores the sequence from it. The bytes
// never travel inside a message: the snapshot is shared, immutable, behind a shared_ptr.
#pragma once

#include "runtime/ports/store.hpp"
#include "runtime/time.hpp"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace troupe::runtime {

enum class step_phase : std::uint8_t { prefill, decode, encode };

std::string to_string(step_phase p);

/// How a sequence's next token is chosen: the sampling parameters of its request (the real
/// device maps them onto kernels/sampling.hpp; the simulated device ignores them).
struct sampling {
  /// 0 picks the most likely token (greedy); > 0 samples at that temperature.
  double temperature = 1.0;
  /// Keep the k most likely tokens (0: off), the smallest set reaching top_p (1: off), the
  /// tokens with p >= min_p * p_max (0: off).
  std::int32_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  /// The request's seed: a draw depends only on (seed, position), never on the batch.
  std::uint64_t seed = 0;
  /// -1: no log-probabilities; 0: the sampled token's; k > 0: also the k most likely tokens'.
  std::int32_t top_logprobs = -1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling& x) {
  return f(caf::meta::type_name("sampling"), x.temperature, x.top_k, x.top_p, x.min_p, x.seed,
           x.top_logprobs);
}

/// One sequence's share of a step, as llama.cpp's batch rows: which sequence, where its new
/// tokens start, the tokens, and whether the step ends with a token drawn for it.
struct step_sequence {
  /// The sequence (its request's id). The device keeps that sequence's cache between steps:
  /// the first step of a sequence opens it, `device_release` frees it.
  std::uint64_t sequence = 0;
  /// Position of the first new token: the tokens the sequence's cache already holds.
  std::uint64_t position = 0;
  /// New tokens in this step.
  std::uint32_t count = 0;
  /// Their ids (`count` of them) in the real world; the simulated world, which only costs the
  /// step, may leave them empty.
  std::vector<std::int32_t> tokens{};
  /// Draw the token after the last new one (false for a prefill chunk short of the prompt's
  /// end, whose last logits nothing needs).
  bool sample = false;
  sampling params;
  /// Speculative decoding (with `sample`): the last `verify` of the new tokens are drafts the
  /// device proposed for this sequence in its previous step. The device draws the token after
  /// the first new one; while that token equals the next draft, the draft is accepted and the
  /// token after it is drawn too. It answers 1 + accepted tokens, in order, and its cache keeps
  /// the accepted drafts only (the rejected ones are rolled back).
  std::uint32_t verify = 0;
  /// Answer drafts for this sequence's next step (device_result::drafts).
  bool propose = false;
  /// Overlapped scheduling: the step was built while the device's previous step, which draws
  /// this sequence's next token, still ran, so the builder knows neither that token nor (with
  /// speculation) how many tokens that step keeps. The device fills them in: the first new
  /// token is the last token it drew for this sequence, the `verify` after it are the first
  /// drafts it proposed for the sequence in that step, and `position` is what the sequence's
  /// cache holds (the builder's `position` is a lower bound, `tokens` placeholders). So `count`
  /// is 1 + `verify`. A device that has drawn no token for the sequence, or proposed fewer than
  /// `verify` drafts, refuses the step (invalid_step).
  bool feed_drawn = false;
  /// Decode with prefix keeping on: when the step leaves the sequence's cache exactly at a
  /// block boundary, the device sets its State KV and SWA KV at that length aside (the newest
  /// boundary only, until the sequence is released), so that a kv_keep at that length, sent
  /// once the step's tokens are known and possibly after the next step ran, keeps them. A
  /// device that keeps may verify fewer of the row's drafts, so that the step does not cross
  /// the next block boundary but ends on it (the output is the same; the drafts cut are
  /// proposed again).
  bool keep = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_sequence& x) {
  return f(caf::meta::type_name("step_sequence"), x.sequence, x.position, x.count, x.tokens,
           x.sample, x.params, x.verify, x.propose, x.feed_drawn, x.keep);
}

/// One step of device work: the batch, and the totals a perf model costs it by.
struct device_step {
  /// Caller-chosen id, echoed in the result.
  std::uint64_t id = 0;
  step_phase phase = step_phase::prefill;
  /// Tokens computed in this step (summed over sequences).
  std::uint64_t tokens = 0;
  /// Sequences in the batch.
  std::uint32_t sequences = 0;
  /// Total KV length the step attends over (summed over sequences).
  std::uint64_t context_tokens = 0;
  /// Sequences that ask for drafts (`propose`): the draft layers' share of the step.
  std::uint32_t proposing = 0;
  /// Token masks the step's sampling needs: 1 + `verify` per sequence sampled under a
  /// structured-output constraint (each verified position is drawn under the grammar). A perf
  /// model costs them; a real device's masks take real time.
  std::uint32_t masks = 0;
  /// The scheduler's CPU time to prepare this step, which the device waits for unless the
  /// step was prepared while an earlier one ran: the simulated device starts it no earlier than
  /// `prepare` after it arrives. Real devices ignore it (their scheduler's time is real).
  duration prepare{0};
  /// The sequences, each at most once. Steps that only cost work (vision encodes, and the
  /// simulator's prefill chunks) may leave it empty.
  std::vector<step_sequence> batch{};
  /// Structured output: of the sequences this step samples under a constraint for the first
  /// time (a prefill's last chunk), the least time since their engine took the job; negative:
  /// none. Their constraints compile from then at the latest, and the first mask comes with the
  /// compile, so a perf model makes the step last at least what is left of a compile
  /// (perf_options::compile_s). A real device's first mask waits in its port for real.
  duration first_constraint_age{-1};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_step& x) {
  return f(caf::meta::type_name("device_step"), x.id, x.phase, x.tokens, x.sequences,
           x.context_tokens, x.proposing, x.masks, x.prepare, x.batch, x.first_constraint_age);
}

/// A token drawn for one sequence, with its log-probability and the most likely alternatives
/// when the sequence's sampling asked for them (top_logprobs >= 0).
struct sampled_token {
  std::uint64_t sequence = 0;
  std::int32_t token = 0;
  float logprob = 0.0f;
  /// (token, log-probability), most likely first; top_logprobs of them.
  std::vector<std::pair<std::int32_t, float>> top{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampled_token& x) {
  return f(caf::meta::type_name("sampled_token"), x.sequence, x.token, x.logprob, x.top);
}

/// The drafts a device proposes for a sequence's next step (DSpark: up to 5), each with the
/// draft head's confidence: the predicted probability that the target accepts it given that it
/// accepts every draft before it. The simulated device leaves `tokens` empty.
struct draft_proposal {
  std::uint64_t sequence = 0;
  std::vector<std::int32_t> tokens{};
  std::vector<float> confidences{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, draft_proposal& x) {
  return f(caf::meta::type_name("draft_proposal"), x.sequence, x.tokens, x.confidences);
}

/// The outcome of a step: when it started and finished on the device's clock, and the tokens
/// drawn for the sequences of the batch that asked for one (`sample`), in batch order: one per
/// sequence, or 1 + accepted drafts for a sequence that verified drafts. `drafts`: a proposal
/// for each sequence that asked (`propose`), in batch order.
struct device_result {
  std::uint64_t id = 0;
  time_point started{};
  time_point finished{};
  std::vector<sampled_token> sampled{};
  std::vector<draft_proposal> drafts{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_result& x) {
  return f(caf::meta::type_name("device_result"), x.id, x.started, x.finished, x.sampled,
           x.drafts);
}

/// Frees a sequence's cache on the device (its request finished, moved or was cancelled). A
/// sequence the device does not hold is ignored.
struct device_release {
  std::uint64_t sequence = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_release& x) {
  return f(caf::meta::type_name("device_release"), x.sequence);
}

/// One serialised piece of a sequence's KV: the bytes of one of kernels/kv_blocks.hpp's framed
/// formats and the XXH3-64 of all of them (checked before the bytes are restored; the frame
/// carries its own checksum too).
struct kv_bytes {
  std::string bytes{};
  std::uint64_t checksum = 0;
};

/// A sequence's KV as a device exported it: everything another device of the same model needs
/// to continue the sequence exactly where it stood. Immutable once made; shared by handle.
struct kv_snapshot {
  /// Which model (weights and token map) made it: a device imports only its own model's
  /// snapshots. Devices that compute nothing name themselves ("sim", "script").
  std::string model{};
  /// Tokens the sequence held: the position of its next token.
  std::uint64_t length = 0;
  /// Block KV: full 128-token blocks 0..n-1 in order.
  std::vector<kv_bytes> blocks{};
  /// State KV: the unfinished block, compressor state, length, Engram look-back.
  kv_bytes state{};
  /// SWA KV: every layer's sliding-window ring.
  kv_bytes swa{};
  /// The DSpark draft context (kernels/kv_blocks.hpp's serialize_draft), when the sequence has
  /// one (speculative decoding): the importing device then drafts as the exporting one would.
  /// Empty: none (the importing device starts one at `length`).
  kv_bytes draft{};
};

/// The handle a snapshot travels by (never its bytes).
using kv_snapshot_ptr = std::shared_ptr<const kv_snapshot>;

/// Asks a device for the snapshot of one of its sequences (the sequence stays on the device
/// until released). Answered with a kv_snapshot_ptr, or an error for a sequence it does not
/// hold. Answered after the steps queued before it. With `first_block` > 0 the snapshot's
/// `blocks` start at that block (blocks[0] is block first_block); with `blocks_only` it holds
/// no State or SWA KV: what persisting newly filled blocks needs.
struct kv_export {
  std::uint64_t sequence = 0;
  std::uint64_t first_block = 0;
  bool blocks_only = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_export& x) {
  return f(caf::meta::type_name("kv_export"), x.sequence, x.first_block, x.blocks_only);
}

/// Restores `sequence` on a device from a snapshot (of another device). Answered with ok once
/// the device holds the sequence at snapshot->length; its next step starts at that position.
/// A snapshot of another model, a checksum mismatch, corrupt bytes or a sequence the device
/// already holds are answered with an error and leave no sequence behind (the caller then
/// recomputes the sequence from its tokens).
struct kv_import {
  std::uint64_t sequence = 0;
  kv_snapshot_ptr snapshot;
};

/// Keeps a copy of a sequence's State KV and SWA KV (its unfinished block, compressor state
/// and sliding-window rings: everything of it that is not Block KV) as they were at `length`
/// tokens, a block boundary, in the device's host memory under `key`, the hash-chain key of
/// the block that ends there. Sent when a prefill chunk ends exactly at a block boundary (the
/// sequence is at `length` now), and when a decode step left a sequence at one (the device
/// set that state aside: step_sequence::keep), so that a later request whose cached prefix
/// ends there continues exactly instead of by bounded replay (kv_restore). No reply; a
/// sequence the device does not hold, or whose state at `length` it has neither now nor set
/// aside, is ignored. Devices bound what they keep (least recently used copies go first); the
/// simulated device keeps nothing.
struct kv_keep {
  std::uint64_t sequence = 0;
  store_key key;
  std::uint64_t length = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_keep& x) {
  return f(caf::meta::type_name("kv_keep"), x.sequence, x.key, x.length);
}

/// Asks a device for the copy it kept under `key` at `length` tokens (kv_keep), so that another
/// device opens a sequence of the same prefix exactly (kv_restore::kept): answered with a
/// snapshot of that copy (its model, length, State and SWA KV with their checksums, no
/// blocks), or device_errc::unknown_sequence when the device keeps no such copy (it never
/// kept one, dropped it, or kept one at another length; the simulated device keeps nothing).
struct kv_kept_export {
  store_key key;
  std::uint64_t length = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_kept_export& x) {
  return f(caf::meta::type_name("kv_kept_export"), x.key, x.length);
}

/// Opens `sequence` on a device from persisted Block KV: `blocks` holds the first n full blocks
/// of its context (from the store; its `length` is 128·n, its state and SWA empty) and
/// `tokens` those 128·n tokens. The device restores the blocks, then the sequence's State KV
/// and SWA KV: from its kept copy under `key` (kv_keep) when it has one at that length, exact;
/// else from `kept`, a copy another device kept there (kv_kept_export), when it is of this
/// model and length and its checksums hold, exact too; otherwise by bounded replay, which
/// recomputes the last sliding window of `tokens` only (kernels::model::replay). A `kept`
/// that does not fit is ignored, not refused. Answered with kv_restored once the sequence holds 128·n tokens;
/// its next step starts there. A block that fails its checksum or does not fit the model, a
/// token count that does not match, or a sequence the device already holds, is answered with
/// device_errc::snapshot_rejected and leaves no sequence behind (the caller then computes the
/// whole context).
struct kv_restore {
  std::uint64_t sequence = 0;
  kv_snapshot_ptr blocks;
  store_key key;
  std::vector<std::int32_t> tokens{};
  kv_snapshot_ptr kept{};
};

/// The answer to a kv_restore: the tokens the sequence holds, and whether its window and
/// unfinished-block state were rebuilt by bounded replay (an approximation of the exact
/// state: docs/model.md) rather than restored from a kept copy, or restored from the copy
/// the request brought (kv_restore::kept).
struct kv_restored {
  std::uint64_t length = 0;
  bool replayed = false;
  bool pulled = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_restored& x) {
  return f(caf::meta::type_name("kv_restored"), x.length, x.replayed, x.pulled);
}

/// Replies to each step once it has run; steps run one at a time in arrival order. A step the
/// device cannot run (an unknown token, a sequence whose position does not match its cache)
/// is answered with an error and changes no cache. Exports, imports, keeps and restores run in
/// the same order.
using device_port = caf::typed_actor<caf::replies_to<device_step>::with<device_result>,
                                     caf::reacts_to<device_release>,
                                     caf::replies_to<kv_export>::with<kv_snapshot_ptr>,
                                     caf::replies_to<kv_import>::with<caf::ok_atom>,
                                     caf::reacts_to<kv_keep>,
                                     caf::replies_to<kv_kept_export>::with<kv_snapshot_ptr>,
                                     caf::replies_to<kv_restore>::with<kv_restored>>;

/// Why a device refused a request. Errors carry the category `device_error_category`.
enum class device_errc : std::uint8_t {
  /// The device has no model to run: loading it failed (the context says why).
  load_failed = 1,
  /// A step the device cannot run: a position that does not match the sequence's cache, a
  /// token out of range, a count that does not match the tokens, a sequence twice in a
  /// batch, invalid sampling parameters.
  invalid_step,
  /// The device does not hold that sequence.
  unknown_sequence,
  /// A snapshot the device cannot import: another model's, a checksum mismatch, corrupt or
  /// inconsistent bytes, or a sequence the device already holds.
  snapshot_rejected,
  /// The model failed while computing (the caches are as before the step).
  compute_failed,
};

/// The category atom of device errors.
constexpr caf::atom_value device_error_category = caf::atom("device");

/// The name of a device error code, e.g. "invalid_step".
std::string to_string(device_errc code);

/// Makes a device error; `context` is shown in parentheses when rendered.
caf::error make_error(device_errc code, std::string context);

/// Checks a step's batch against the sequences a device holds: each sequence at most once,
/// count > 0, `verify` < count and only with `sample`, `count` ids (required when
/// `ids_required`, else none or `count`), and a
/// position equal to the tokens its cache holds (`held(sequence)`: 0 for one it does not hold,
/// which must then start at 0); `extra(sequence)` adds the device's own check (non-empty: the
/// reason it fails). Returns device_errc::invalid_step naming the step and sequence, or none.
caf::error validate_step(const device_step& step, bool ids_required,
                         const std::function<std::uint64_t(std::uint64_t)>& held,
                         const std::function<std::string(const step_sequence&)>& extra);

/// True when `err` is a device error with code `code`.
bool is(const caf::error& err, device_errc code);

/// How long a step takes on a simulated device (the perf model plugs in here).
using step_cost_fn = std::function<duration(const device_step&)>;

/// The simulated world's token at `position` of sequence `sequence`: decoding is modelled as
/// deterministic, so a token depends only on its sequence and position, wherever (and after
/// however many reroutes) it is generated. Never a negative id.
std::int32_t modelled_token(std::uint64_t sequence, std::uint64_t position) noexcept;

/// How the simulated device models DSpark drafts. The draft for position q at depth j (1..5:
/// q is j after the step's first new token) has confidence mean[j - 1] + spread · (u − ½),
/// clamped to [0.01, 0.99], with u uniform in [0, 1) from (sequence, q); the target accepts
/// it when a second uniform from (sequence, q) falls below that confidence. The confidences
/// are so calibrated: a draft reached is accepted with the probability its confidence states.
/// The defaults are assumptions (no public per-depth figures), not calibrated values.
struct sim_draft_model {
  std::array<float, 5> mean{0.85f, 0.8f, 0.75f, 0.7f, 0.65f};
  float spread = 0.3f;
  float confidence(std::uint64_t sequence, std::uint64_t position, std::uint32_t depth) const;
  bool accepted(std::uint64_t sequence, std::uint64_t position, std::uint32_t depth) const;
};

/// A simulated device: each step occupies the device for cost(step), after any steps queued
/// before it and no earlier than its `prepare` after it arrives, and is answered when it finishes, with modelled_token(sequence, position +
/// count) for each sequence that asked for a token (logprob 0, no alternatives): the step's
/// token contents are not read. Releases are ignored. A negative cost counts as zero. Exports
/// are answered with one shared empty snapshot (model "sim") and imports with ok, both when
/// the steps queued before them finish and taking no device time: the simulated world
/// allocates nothing per sequence or token for a hand-off. Keeps are ignored; a restore is
/// answered likewise, with the length of its blocks and not replayed.
///
/// Speculative decoding (step_sequence::verify / propose) follows `sim_draft_model`: a
/// proposal carries max_drafts confidences and no tokens; a verified draft is accepted or not
/// by a pure function of (sequence, position), so the answer is the same whatever the batch.
device_port spawn_sim_device(caf::actor_system& sys, step_cost_fn cost,
                             sim_draft_model drafts = {});

} // namespace troupe::runtime

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::runtime::kv_snapshot_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::runtime::kv_import)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::runtime::kv_restore)

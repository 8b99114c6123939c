// cpu_device: the device port on the exact CPU engine (kernels::cpu_backend), or on another
// model_backend made from the same loaded model (`backend`: the CUDA one, kernels/cuda/).
//
// A GPU rank talks to its device only through runtime::device_port; in the simulated world a
// perf model answers with modelled tokens. This is the real implementation: it
// loads a DeepSeek-V4.1 model directory, keeps one KV cache per sequence, runs every step's
// batch (prefill chunks and decode tokens mixed: continuous batching) in one backend step,
// samples each requested token with kernels/sampling.hpp (counter-based: a draw depends only on
// the request's seed and the token's position), and exports / imports a sequence's KV for the
// prefill -> decode hand-off in kernels/kv_blocks.hpp's byte formats.
//
// Threading: the device is a `caf::detached` actor. It has its own thread, on which it loads
// the model and runs every step (the model compute blocks that thread, never one of CAF's
// scheduler threads), one message at a time in arrival order, which is the port's contract.
// The BLAS and attention threads of the model (`threads`) are started by the kernels on top.
//
// Batch invariance: with `batch_invariant` (the default) a sequence's logits, hence its greedy
// tokens and its seeded draws, are bitwise the same whatever else shares its batch and however
// its prompt is chunked. Without it, steps are faster in prefill and tokens may differ in the
// last bits of the logits.
#pragma once

#include "kernels/backend.hpp"
#include "kernels/model.hpp"
#include "kernels/result.hpp"
#include "runtime/metrics.hpp"
#include "runtime/ports/token_constraints.hpp"
#include "runtime/ports/device.hpp"

#include <caf/fwd.hpp>

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::ports {

/// A device's step time as a function of the tokens a step runs: DSpark's cost curve in the
/// real world (actors/engine/speculation.hpp), measured by a CPU device once its model has
/// loaded. Shared between the device that measures it and the decode engines that read it;
/// thread-safe.
class step_profile {
public:
  /// The measured points, (tokens, seconds), tokens increasing.
  using points = std::vector<std::pair<std::uint64_t, double>>;
  void set(points p);
  points get() const;
  /// Seconds for a step of `tokens` tokens: linear between the two measured points around it,
  /// extended by the last two beyond the last (never below the smallest measured time); 0 until
  /// measured.
  double seconds(std::uint64_t tokens) const;

private:
  mutable std::mutex mutex_;
  points points_;
};

/// The expert-parallel load balancer's link to the CPU devices of a pool (troupe serve
/// --eplb): the devices add the router's top-k counts of every step (kernels::model::
/// expert_counts), the balancer reads their sum and proposes placements, and each device
/// switches to the newest one at its next step boundary (kernels::model::
/// set_expert_placement). Thread-safe.
class expert_link {
public:
  /// A link for a model with `experts` routed experts.
  explicit expert_link(std::size_t experts);
  /// A device: tokens routed to each expert since its last report.
  void add(const std::vector<std::uint64_t>& routed);
  /// Tokens routed to each expert by the pool's devices so far.
  std::vector<std::uint64_t> totals() const;
  /// The balancer: the placement the devices switch to at their next step.
  void propose(kernels::expert_placement placement);
  /// A device that has switched to proposal `seen` (0: none yet): the newest proposal, when
  /// there is a newer one, with its number written to `seen`.
  std::optional<kernels::expert_placement> newer_than(std::uint64_t& seen) const;

private:
  mutable std::mutex mutex_;
  std::vector<std::uint64_t> totals_;
  std::uint64_t version_ = 0;
  kernels::expert_placement placement_;
};

/// The token counts a device profiles: 1, 2, 4, ..., 64.
inline constexpr std::uint64_t profile_max_tokens = 64;

struct cpu_device_params {
  /// The model directory (config.json + safetensors, single file or sharded), loaded by the
  /// device on its own thread before it takes its first step.
  std::filesystem::path model_dir;
  /// Or a model already loaded, which the device takes over (its `threads` and
  /// `batch_invariant` were fixed when it was loaded; the two fields below are then unused).
  /// It must have its Engram token map set already, or `engram_map` names one.
  std::optional<kernels::model> model;
  /// BLAS and attention threads of the model.
  int threads = 2;
  /// Batch-invariant mode (kernels::model_options): a request's output does not depend on
  /// what else is in its batch.
  bool batch_invariant = true;
  /// The Engram compressed-token map, for a model with Engram layers (`troupe generate
  /// --engram-map`): a JSON file, or "identity" for random model directories. Empty: none (a
  /// model with Engram layers then fails to load, unless `model` came with its map set).
  std::string engram_map;
  /// Names the model in the snapshots this device exports; a device imports only snapshots
  /// carrying its own name. Empty: model_fingerprint(model_dir) (and the Engram map's content
  /// when the device sets one), so two devices that loaded the same checkpoint exchange
  /// snapshots. A loaded `model` without a directory and without a name gets a name of its own
  /// (its snapshots import only into this device).
  std::string model_id;
  /// Host memory for the State and SWA KV kept at block boundaries (kv_keep): the least
  /// recently used copies are dropped beyond it. 0 keeps none (every restore replays).
  std::uint64_t keep_bytes = 256ull << 20;
  /// Where the device reports its gauges and counters (docs/serve.md, "Metrics"), labelled
  /// device=`name`; null: nowhere. Must outlive the device.
  runtime::registry* metrics = nullptr;
  std::string name;
  /// Structured output: asked for each sampled token's allowed ids (the others are never
  /// drawn) and told the id drawn (runtime/ports/token_constraints.hpp); null: none.
  std::shared_ptr<runtime::token_constraints> constraints;
  /// When set and not yet measured, the device measures it once its model has loaded, before
  /// its first step: steps of 1, 2, 4, ..., profile_max_tokens tokens of a scratch sequence
  /// (closed again), the fastest of three runs each.
  std::shared_ptr<step_profile> profile;
  /// Expert-parallel load balancing (expert_link); null: the MoEs run as one group and
  /// nothing is counted.
  std::shared_ptr<expert_link> experts;
  /// The backend the device runs, made on its thread from the loaded model (its Engram map
  /// set); null: the exact CPU backend (kernels::cpu_backend). A CUDA GPU rank sets
  /// kernels::cuda::cuda_backend::opener here; a backend that fails to open is the device's
  /// load error.
  kernels::backend_opener backend;
  /// The ranks of the device's instance, run as one expert-parallel group of this many
  /// threads (kernels/ep_group_backend.hpp): each rank's model holds the routed experts of its
  /// share of kernels::place_experts (contiguous ranges), the rest of the model whole, and the
  /// ranks gather each other's expert rows at every MoE; the tokens are those of one model.
  /// 1: one model. Above 1 only on the CPU engine from `model_dir` (not with `model`,
  /// `backend` or `experts`: the group keeps its placement), and at most the model's routed
  /// experts; otherwise the load fails and says why.
  std::uint32_t ep_ranks = 1;
  /// With ep_ranks above it, the device runs the group's first `ranks_per_process` ranks as
  /// threads and starts processes for the others, `ranks_per_process` ranks each (the last may
  /// hold fewer): `rank_program ep-rank ...` (ports/rank_processes.hpp), joined to the device by
  /// a socket each (kernels/ep_process.hpp); they load while the device does, and end when the
  /// device does. 0, or ep_ranks or more: every rank a thread of this process.
  std::uint32_t ranks_per_process = 0;
  /// The program of the rank processes: the troupe executable.
  std::filesystem::path rank_program;
  /// Called on the device's thread when a rank process has died and its group with it, with
  /// the ranks that process held, just before the device stops: its instance then re-forms
  /// on the ranks left. Null: nobody is told.
  std::function<void(std::uint32_t ranks)> on_ranks_lost;
};

/// Spawns a CPU device (detached: its own thread). Returns at once; the device then loads its
/// model. A device whose model failed to load stays up and answers every step, export and
/// import with device_errc::load_failed (the message says why); releases are ignored. The
/// device answers:
///   - device_step: validates the whole batch first (positions equal to the tokens each
///     sequence's cache holds, 0 for a sequence it has not seen, which it then opens; count ==
///     tokens.size() > 0; token ids in the vocabulary; each sequence once; valid sampling); any
///     violation is answered with device_errc::invalid_step and changes no cache. Then it runs
///     the batch in one backend step and, for each sequence with `sample`, draws the token at
///     position + count from its last row of logits (temperature 0: greedy); with
///     top_logprobs >= 0 it adds the token's log-softmax of the raw logits and the
///     top_logprobs most likely (token, logprob) pairs, most likely first (lowest id on ties).
///     A model failure is device_errc::compute_failed; if it happens after the caches advanced
///     (non-finite logits), the batch's sequences are released.
///     Speculative decoding: a sequence with `verify` k (at most 6, what a rollback can undo)
///     draws the token after its last non-draft token and, while each draw equals the next
///     draft, the token after that draft, each at its own position with the request's sampling:
///     the answer is 1 + accepted tokens, exactly those a step without drafts would have drawn
///     (greedy or seeded), and the rejected drafts are rolled back. A sequence with `propose`
///     gets the model's DSpark drafts for its next step (up to 6, with the confidence head's
///     probabilities), from a draft context the device keeps per sequence; a prefill chunk
///     (no `sample`) with `propose` only extends that context. A sequence whose context does
///     not reach its step's position (one that arrived by kv_import without a context, or was
///     restored from stored blocks) starts an empty one there. A model without draft layers
///     proposes none.
///   - device_release: closes the sequence (an unknown one is ignored).
///   - kv_export: the sequence's length, Block KV blocks (from first_block), State KV, SWA
///     KV and its draft context when it has one (unless blocks_only), each with its XXH3-64,
///     named by the model id; device_errc::unknown_sequence for a sequence it lacks.
///   - kv_import: restores a sequence it does not hold (and its draft context, when the
///     snapshot carries one) from a snapshot of the same model id; anything wrong (another
///     model, a checksum, corrupt or inconsistent bytes, a sequence it already holds) is
///     device_errc::snapshot_rejected and leaves no sequence behind.
///   - a step: a sequence with step_sequence::keep whose cache then ends at a block boundary
///     has its State and SWA KV copied aside (its newest boundary only; dropped at release).
///   - kv_keep: copies the sequence's State and SWA KV at the message's length into host
///     memory under the key, within `keep_bytes`: the copy set aside at that length (moved,
///     not copied), else its state now when it holds that many tokens, else nothing.
///     It replaces the copy the same sequence kept before, if that is still the sequence's.
///   - kv_kept_export: the copy kept under the key at that length, with checksums (it counts
///     as a use for the least-recently-used order); none: device_errc::unknown_sequence.
///   - kv_restore: imports the blocks (each checked against its XXH3-64 and the model's
///     shapes), then the kept State and SWA KV of the key when there is a copy at that length
///     (exact), else the request's `kept` copy when it is this model's at that length and
///     intact (pulled: exact too; it is not kept here), else rebuilds them by bounded replay
///     of the last sliding window of the tokens (kernels::model::replay). Bad blocks or tokens
///     are device_errc::snapshot_rejected and leave no sequence behind.
/// With `experts`, before each step it switches to the link's newest placement (a placement
/// the model refuses is counted as refused and the device keeps its own), and after it adds
/// the step's router counts (and those of any replay or profile run since) to the link.
/// Times in device_result are the actor clock's (wall time) around the step.
runtime::device_port spawn_cpu_device(caf::actor_system& sys, cpu_device_params params);

/// Sets the Engram token map that `map` names (cpu_device_params::engram_map's forms) on a
/// freshly loaded model, and returns it; empty for no map, when the model has no Engram layers.
/// Errors: a model with Engram layers and no map, a map that does not load or fit.
kernels::result<std::vector<std::int64_t>> set_engram_map(kernels::model& m,
                                                          const std::string& map);

/// A name for the model stored in `dir`: the XXH3-64 of config.json, every tensor's name,
/// dtype and shape, and samples of its bytes (all of a tensor up to 8 KiB, its first and last
/// 4 KiB and 16 strided 256-byte pieces otherwise), as "<model_type>:<16 hex digits>". Cheap
/// (a few pages per tensor) and different for checkpoints that differ in any config field or
/// shape, and, with overwhelming likelihood, in their weights. Errors: an unreadable config or
/// checkpoint.
kernels::result<std::string> model_fingerprint(const std::filesystem::path& dir);

} // namespace troupe::ports

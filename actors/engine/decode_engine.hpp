// decode_engine: the scheduler of one decode instance (continuous batching over its EP group).
//
// A decode instance generates tokens for many requests at once: every device step feeds each
// request in the running batch its last token and draws its next one, and its time grows with the batch and the
// KV it attends over. Requests join and leave the batch at step boundaries (continuous
// batching), up to `max_batch` over the instance. A request arrives with its prompt's KV,
// which crosses the link from the prefill instance before it can join. Every time a
// request's KV fills a 128-token block, the block is persisted (the block writer), so that
// prefill and decode KV are both reusable by later requests.
//
// Protocol: a `decode_job` request is answered with `decode_done` when its last token is
// generated. Requests that arrive while the batch is full wait in arrival order. With
// `progress_every` = N > 0, the sender of the job also gets a `decode_progress` (not a
// reply: an asynchronous notice) every N generated tokens: the tokens it carries have left
// for the client, so a request whose decode instance dies knows exactly how many tokens were
// delivered and resumes elsewhere from there (request.hpp).
//
// Messages carry content: a job brings the token to feed first (`next`, the last one the
// request delivered) and its sampling and stop ids; progress notices and the answer carry the
// generated token ids, in order. A job ends early when it generates one of its stop ids
// (`decode_done::stopped`). A real job also brings its context's ids and, from its prefill
// instance, the context's KV (`kv`, exported there): the engine imports it into its device
// before the job joins the batch. When there is none, or the import is refused (a checksum
// mismatch, another model's KV: the device checks), the job's first step recomputes the
// context's KV on this device instead — it is never decoded from corrupt KV; such imports are
// counted (`engine_stats::kv_import_failures`). The simulated world leaves the ids empty: its
// KV arrives by the modelled link transfer, its device answers modelled tokens. A real job's
// filled blocks are keyed by their ids, continuing the prompt's chain (the same keys a later
// prompt holding these tokens computes), exported from the device (kv_export, blocks only)
// and handed with their keys to the store sink; the simulated world's go to the block sink,
// keyed by content keys (block_writer.hpp).
// `(cancel_atom, request)` drops a job (its requester has gone): it is answered with an error,
// its KV bookings are freed and its sequence leaves the device.
//
// Drain: `(drain_atom, grace)` tells the engine its instance is leaving. It calls its `leave`
// callback at once (decode_lb excludes the instance: no new routes), keeps stepping its batch
// (jobs already routed to it are still taken), and when its work is done or at the first step
// boundary at or after `grace` — whichever comes first — hands off: every job not finished is
// answered with a `decode_done` marked `forwarded`, carrying the exact number of tokens it
// generated here, so that its request goes to another decode instance with its KV (no
// re-prefill; request.hpp). A real job's KV is exported from the device (all of it: Block
// KV, State KV and SWA rings) and carried in the answer (`decode_done::kv`) for the next
// instance to import, as after a prefill; the simulated world models the transfer. The drain
// request is then answered with the number of jobs forwarded, once their KV has left the
// device; the caller stops the instance (fault_injector: the pool supervisor's stop_child, so
// it is not restarted). A job that reaches the engine after the hand-off
// (routed before the exclusion) is forwarded as soon as its KV has arrived.
#pragma once

#include "actors/engine/prefill_engine.hpp"
#include "actors/kv/block_writer.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/ports/token_constraints.hpp"
#include "runtime/time.hpp"

#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors {

/// Decode a request whose context (prompt, plus tokens generated elsewhere before) is
/// `context_tokens` long, generating `output_tokens` more; its KV (`kv_bytes`) is transferred
/// in first. The blocks it fills continue the chain whose last key is `parent`, covering
/// `parent_blocks` blocks (the prompt's keyed blocks; block_writer.hpp), persisted with the
/// TTL of `traffic`.
struct decode_job {
  std::uint64_t request = 0;
  std::uint64_t context_tokens = 0;
  std::uint64_t output_tokens = 0;
  std::uint64_t kv_bytes = 0;
  block_key parent;
  std::uint64_t parent_blocks = 0;
  traffic_class traffic = traffic_class::chatbot;
  /// Send the job's sender a decode_progress every this many generated tokens (0: never).
  std::uint64_t progress_every = 0;
  /// The token fed by the first step (at position `context_tokens`): the last one delivered.
  std::int32_t next = 0;
  /// The context's ids (`context_tokens` of them) in the real world; empty in the simulated one.
  std::vector<std::int32_t> context;
  runtime::sampling sampling;
  /// Generating one of these ends the job (it is the last token sent).
  std::vector<std::int32_t> stop_ids;
  /// The context's KV from the prefill instance (prefill_done::kv), or empty. An in-process
  /// handle, not serialised.
  runtime::kv_snapshot_ptr kv;
  /// Across processes: where the KV's bytes are offered (prefill_done::kv_ticket), and the
  /// runs of blocks before them (prefill_done::kv_parts), which the KV bridge joins.
  runtime::fabric_ticket kv_ticket;
  std::vector<kv_part> kv_parts;
  /// The request's structured-output constraint, for a device in another process to rebuild
  /// (format empty: none).
  runtime::constraint_spec constraint{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_job& x) {
  return f(caf::meta::type_name("decode_job"), x.request, x.context_tokens, x.output_tokens,
           x.kv_bytes, x.parent, x.parent_blocks, x.traffic, x.progress_every, x.next, x.context,
           x.sampling, x.stop_ids, x.kv_ticket, x.kv_parts, x.constraint);
}

/// `tokens` of the job's output have been generated and delivered so far (a multiple of the
/// job's `progress_every`, below its `output_tokens`: the last ones come with decode_done);
/// `ids` are the ones generated since the previous notice, `logprobs` theirs when the job's
/// sampling asked for them.
struct decode_progress {
  std::uint64_t request = 0;
  instance_id instance = 0;
  std::uint64_t tokens = 0;
  std::vector<std::int32_t> ids;
  std::vector<runtime::sampled_token> logprobs;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_progress& x) {
  return f(caf::meta::type_name("decode_progress"), x.request, x.instance, x.tokens, x.ids,
           x.logprobs);
}

struct decode_done {
  std::uint64_t request = 0;
  instance_id instance = 0;
  /// When the KV had arrived, when the request joined the batch, and when its last token
  /// was generated.
  runtime::time_point arrived{};
  runtime::time_point joined{};
  runtime::time_point finished{};
  std::uint64_t tokens = 0;
  /// Full 128-token blocks persisted for this request while decoding.
  std::uint64_t blocks_persisted = 0;
  /// The instance drained before the job was done: `tokens` (< the job's output_tokens) were
  /// generated and delivered here, and the request continues elsewhere with its KV.
  bool forwarded = false;
  /// The job generated one of its stop ids (the last of `ids`).
  bool stopped = false;
  /// The ids generated since the last progress notice (all of them without notices), and
  /// their logprobs when asked for.
  std::vector<std::int32_t> ids{};
  std::vector<runtime::sampled_token> logprobs{};
  /// Forwarded real jobs: the request's KV exported from this instance's device, for the next
  /// instance to import (null: it recomputes). An in-process handle, not serialised.
  runtime::kv_snapshot_ptr kv{};
  /// Across processes: where the forwarded KV's bytes are offered.
  runtime::fabric_ticket kv_ticket{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_done& x) {
  return f(caf::meta::type_name("decode_done"), x.request, x.instance, x.arrived, x.joined,
           x.finished, x.tokens, x.blocks_persisted, x.forwarded, x.stopped, x.ids, x.logprobs,
           x.kv_ticket);
}

// drain_atom (a leave notice: serve for the grace period, then hand off) is in
// prefill_engine.hpp, shared by both engines.
/// The engine's own grace timer.
using drain_end_atom = caf::atom_constant<caf::atom("drainend")>;

/// Replies: (drain_atom, grace) -> the number of jobs forwarded, once the hand-off is done.
using decode_engine_actor
  = caf::typed_actor<caf::replies_to<decode_job>::with<decode_done>,
                     caf::replies_to<engine_stats_atom>::with<engine_stats>,
                     caf::replies_to<drain_atom, runtime::duration>::with<std::uint64_t>,
                     caf::reacts_to<drain_end_atom>, caf::reacts_to<cancel_atom, std::uint64_t>,
                     caf::replies_to<kept_state_get>::with<kept_state>,
                     caf::reacts_to<kv_part_streamed>>;

/// Speculative decoding: none; every sequence verifies the same number of drafts; or DSpark's
/// per-step choice (speculation.hpp).
enum class speculation : std::uint8_t { off, fixed, dspark };

std::string to_string(speculation s);

/// A speculation mode as command lines spell it: off, fixedK (K = 1..5 drafts verified every
/// step) or dspark.
struct speculation_setting {
  speculation spec = speculation::off;
  std::uint32_t fixed_drafts = 5;
};

/// Parses off, fixed1 .. fixed5 or dspark; nullopt for anything else.
std::optional<speculation_setting> parse_speculation(std::string_view text);

struct decode_engine_params {
  instance_id instance = 0;
  /// Requests in the running batch, over the whole instance.
  std::uint32_t max_batch = 256;
  /// Speculative decoding, for every request (a real device accepts a draft when it equals the
  /// token it draws at that position, so the output is the same as without drafts). Each step
  /// asks the device for the next step's drafts; `fixed` verifies min(fixed_drafts, proposed) of them, `dspark` the
  /// lengths choose_verify_lengths picks under `step_cost`.
  speculation spec = speculation::off;
  std::uint32_t fixed_drafts = 5;
  /// The instance's step time for a step (DSpark's cost curve): pure, no side effects.
  runtime::step_cost_fn step_cost;
  /// Called after each step that verified drafts: sequences that verified, drafts verified,
  /// drafts accepted (the simulation's report; may be empty).
  std::function<void(std::uint64_t, std::uint64_t, std::uint64_t)> on_verify;
  /// Overlapped scheduling: step N+1 is built and sent while step N runs, so that the device
  /// does not wait for the scheduler between steps. Only N's sampled tokens are missing when
  /// N+1 is built (with speculation also N's drafts and how many of N's it accepts): the device
  /// feeds them itself (step_sequence::feed_drawn). The costs: a job joins the batch one step
  /// later; a job that ends on a stop id, or reaches its length through accepted drafts, has
  /// tokens computed for it in the step built ahead that are dropped; and a speculating job's
  /// verify length is chosen on confidences two steps old instead of one (verify_lengths).
  bool overlap = false;
  /// The scheduler's CPU time to build a step (device_step::prepare): the simulated world's
  /// charge for it, which overlap hides; empty in the real world, whose time is real.
  runtime::step_cost_fn prepare_cost;
  /// Called with every step's start and end on the device's clock, and the device's idle time
  /// before it when the batch had work throughout (engine_stats::stalled): a timeline (may be
  /// empty).
  std::function<void(runtime::time_point, runtime::time_point, runtime::duration)> on_step;
  /// Real world, with a store sink: the device is asked to keep a job's window state each
  /// time a step leaves its cache at a block boundary (step_sequence::keep, kv_keep; each keep
  /// replaces the job's one before), and when the job ends here (done or cancelled, not
  /// forwarded) this is told the key of the last one and the engine, to be asked with
  /// kept_state_get: a next turn whose cached prefix ends there restores exactly on any
  /// prefill instance (decode_instance has it send prefill_kept to the prefill balancer).
  /// Null: nothing is kept.
  std::function<void(const block_key&, const caf::actor&)> kept;
};

/// Called once per step that filled a block, with an entry for each request whose KV filled a
/// block in that step (and a `last` entry with `count` 0 for a request that filled blocks
/// earlier and leaves in that step), for the block writer to persist.
using block_sink = std::function<void(const std::vector<filled_blocks>&)>;

/// Where a real job's filled blocks go with their bytes (exported from the device) and their
/// content keys, to be written to the store (the instance's block writer).
using store_sink = std::function<void(store_blocks)>;

/// Spawns a decode engine that runs its steps on `device` (the instance's leader rank) and
/// receives KV over `ingress` (from prefill instances). `persist` may be empty. `leave` is
/// called when a drain starts (the instance tells its balancer to exclude it); may be empty.
decode_engine_actor spawn_decode_engine(caf::local_actor* parent, decode_engine_params params,
                                        runtime::device_port device, runtime::link_port ingress,
                                        block_sink persist, std::function<void()> leave = {},
                                        store_sink store = {});

} // namespace troupe::actors

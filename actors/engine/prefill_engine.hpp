// prefill_engine: the scheduler of one prefill instance (chunked prefill over its EP group).
//
// A prefill instance computes the uncached part of each prompt and hands the KV on. Long
// prompts must not block short ones for seconds, so the engine cuts work into chunks: each
// device step takes up to `step_tokens` tokens — every ready job first gets an equal share
// (at least one 128-token block), what is left goes to jobs in arrival order; a job may span
// several steps — and runs them as one batch on the instance's leader rank, whose step time
// covers the whole EP group. Cached blocks are not computed: the instance's block fetcher
// reads them (store → host → device) layer by layer, so a job may start computing once the
// first layer has arrived and finishes no earlier than the last one. The sliding-window KV
// is never persisted, so even a fully cached prompt recomputes its last `replay_tokens`
// (bounded replay: a fixed cost whatever the context length).
//
// Messages carry content (docs/architecture.md, "One message shape for both worlds"): a job
// brings its context's token ids and its sampling, each device step carries per sequence its
// position, new token ids and whether to sample, and the job's last step draws the request's
// next token, which `prefill_done` carries. The simulated world leaves the ids empty and its
// device answers modelled tokens; the real device computes them.
//
// The real world's cluster KV cache (docs/kv-store.md). A real job (with ids and its chain)
// whose prefix the CHECK role found cached reads those blocks from the store (`store_get`,
// all in parallel; never the block holding the context's last token, which must be computed
// to draw the next one), and opens its sequence on the device from the leading run that
// arrived intact (`kv_restore`): the device takes the prefix's window and unfinished-block
// state from the copy it kept at that boundary when it has one (exact), else rebuilds them by
// bounded replay of the prefix's last window. The job then computes only its tail. A block
// the store cannot serve (missing, expired, corrupt) ends the prefix there; a restore the
// device refuses computes the whole context. While computing, a chunk never crosses the
// context's last block boundary before its end, where the engine has the device keep the
// state (`kv_keep`) for a later request with the same prefix. A real job ends with its KV
// exported from the device (kv_export: Block KV blocks, State and SWA KV in their checksummed
// formats) and handed on in `prefill_done::kv` for the decode instance to import; an export
// that fails leaves `kv` empty and the decode instance recomputes the context. The full blocks
// it computed (not those it restored) are persisted by the engine's block writer
// (store_blocks): reserved, written to the store, then committed in the CHECK role.
//
// A streaming job (prefill_job::stream_kv, set by the KV bridge of a launched prefill process)
// has the full blocks each chunk completed exported at once, while more of it is left to
// compute, and sent to its sender as prefill_kv_part runs; its final export holds the blocks
// after them (prefill_done::kv_first_block), or all of them when a run's export failed.
//
// Protocol: a `prefill_job` request is answered with `prefill_done` when the job's last token
// is computed and its fetched KV is complete. `(cancel_atom, request)` drops a job (its
// requester has gone): it is answered with an error and its sequence leaves the device.
#pragma once

#include "actors/kv/block_key.hpp"
#include "actors/kv/block_writer.hpp"
#include "actors/lb/prefill_balancer.hpp"
#include "actors/request/generation.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/fabric.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/ports/token_constraints.hpp"
#include "runtime/time.hpp"

#include <caf/actor_control_block.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::actors {

/// Prefill `input_tokens` of a request, `cached_tokens` of which (a prefix) come from the
/// store as `fetch_bytes` of KV.
struct prefill_job {
  std::uint64_t request = 0;
  std::uint64_t input_tokens = 0;
  std::uint64_t cached_tokens = 0;
  std::uint64_t fetch_bytes = 0;
  /// The context's token ids (`input_tokens` of them), or empty (the simulated world).
  std::vector<std::int32_t> tokens;
  /// How the token after the context is drawn.
  runtime::sampling sampling;
  /// Real world: the keys of the context's full blocks as far as its prompt goes (make_chain),
  /// which the cached prefix is fetched by and the computed blocks are persisted under, and
  /// the traffic class their TTL follows. Empty in the simulated world.
  std::vector<block_key> chain{};
  traffic_class traffic = traffic_class::chatbot;
  /// The request's structured-output constraint, for a device in another process to rebuild
  /// (format empty: none).
  runtime::constraint_spec constraint{};
  /// Real world: the engine of another instance (prefill or decode) whose device kept the
  /// window state where the cached prefix this job restores ends (prefill_lb's record of
  /// prefill_kept); the job asks it for that state (kept_state_get) while its blocks are
  /// read, and restores exactly with it. Null: none known (the device's own copy, or bounded
  /// replay).
  caf::strong_actor_ptr keeper{};
  /// Real world, across processes: the decode engine (the KV bridge in front of it) the
  /// request booked when its prefill began (request_services::stream_kv), which pulls the
  /// job's KV parts while the rest of the prompt computes. Null: none booked yet.
  caf::strong_actor_ptr kv_to{};
  /// Export the job's full blocks as its chunks complete them and send each run to the job's
  /// sender (prefill_kv_part), so that they cross to the decode instance while the rest
  /// computes; the export at the end then holds only the blocks after those
  /// (prefill_done::kv_first_block). Set by the request (request_services::stream_kv) and by
  /// the KV bridge in front of a launched engine. The simulated world moves no bytes: it counts
  /// the blocks and tells kv_to how many bytes cross its hand-off link (kv_part_streamed).
  bool stream_kv = false;
  /// The simulated world: a token's KV bytes (what a streamed block occupies on the link).
  std::uint64_t kv_bytes_per_token = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_job& x) {
  return f(caf::meta::type_name("prefill_job"), x.request, x.input_tokens, x.cached_tokens,
           x.fetch_bytes, x.tokens, x.sampling, x.chain, x.traffic, x.constraint, x.keeper,
           x.kv_to, x.stream_kv, x.kv_bytes_per_token);
}

/// A run of a streaming job's full blocks, exported while its prefill goes on: blocks
/// [first_block, first_block + kv->blocks.size()) of its sequence, in `kv->blocks` (no State
/// or SWA KV). The engine sends the runs in order to the job's sender (the KV bridge), all of
/// them before the job's prefill_done. In-process only.
struct prefill_kv_part {
  std::uint64_t request = 0;
  std::uint64_t first_block = 0;
  runtime::kv_snapshot_ptr kv;
};

/// Across processes: where one run of a request's blocks is offered (prefill_kv_part's bytes
/// on the prefill process's fabric link: kv_bridge's encoding of a blocks-only snapshot).
struct kv_part {
  std::uint64_t first_block = 0;
  std::uint64_t blocks = 0;
  runtime::fabric_ticket ticket{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_part& x) {
  return f(caf::meta::type_name("kv_part"), x.first_block, x.blocks, x.ticket);
}

/// The prefill bridge tells the decode bridge the request booked (prefill_job::kv_to) of a
/// run of blocks offered for `request`; it pulls the bytes at once. No reply.
struct kv_part_offered {
  std::uint64_t request = 0;
  kv_part part;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_part_offered& x) {
  return f(caf::meta::type_name("kv_part_offered"), x.request, x.part);
}

/// The simulated world's streamed KV (prefill_job::stream_kv): `bytes` of a request's blocks
/// leave its prefill instance now for the decode instance the request booked
/// (prefill_job::kv_to), over that instance's hand-off link, ahead of the rest that the
/// request's decode_job brings. No reply.
struct kv_part_streamed {
  std::uint64_t request = 0;
  std::uint64_t bytes = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_part_streamed& x) {
  return f(caf::meta::type_name("kv_part_streamed"), x.request, x.bytes);
}

/// An engine's report to the prefill balancer: its device now keeps the window state (SWA
/// rings, unfinished block) of the prefix that ends with block `key` (kv_keep). A prefill
/// engine reports at its prompts' last block boundaries (it is the balancer's member
/// `instance`, asked through the engine the balancer knows: `keeper` null); a decode engine
/// at the block boundaries its steps end on, and names what to ask in `keeper` (itself, or
/// the kv_bridge in front of it in another process).
struct prefill_kept {
  instance_id instance = 0;
  block_key key;
  caf::strong_actor_ptr keeper{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_kept& x) {
  return f(caf::meta::type_name("prefill_kept"), x.instance, x.key, x.keeper);
}

/// Asks an engine (prefill or decode) for the window state its device kept where a
/// `length`-token prefix ends with block `key` (an SWA ring pull: docs/serve.md, "Restoring a
/// prefix"), for `request`, a prefill job of another instance. Answered with kept_state, or an
/// error when the device keeps no such copy (the asking job then replays).
struct kept_state_get {
  std::uint64_t request = 0;
  runtime::store_key key;
  std::uint64_t length = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kept_state_get& x) {
  return f(caf::meta::type_name("kept_state_get"), x.request, x.key, x.length);
}

/// The kept window state: in one process by handle (a snapshot with State and SWA KV and no
/// blocks), across processes as a fabric ticket (its bytes: kv_bridge's encoding).
struct kept_state {
  runtime::kv_snapshot_ptr kv;
  runtime::fabric_ticket ticket{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kept_state& x) {
  return f(caf::meta::type_name("kept_state"), x.ticket);
}

/// An engine's answer to kept_state_get: its device's copy (kv_kept_export), or the device's
/// error when it keeps none there.
template <class Self>
caf::typed_response_promise<kept_state> answer_kept_state(Self* self,
                                                          const runtime::device_port& device,
                                                          const kept_state_get& g) {
  auto rp = self->template make_response_promise<kept_state>();
  self->request(device, caf::infinite, runtime::kv_kept_export{g.key, g.length})
    .then([rp](runtime::kv_snapshot_ptr kv) mutable { rp.deliver(kept_state{std::move(kv)}); },
          [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
  return rp;
}

struct prefill_done {
  std::uint64_t request = 0;
  instance_id instance = 0;
  /// When the job's first chunk started computing, and when the job was complete.
  runtime::time_point started{};
  runtime::time_point finished{};
  /// The token drawn after the context (the request's next output token).
  runtime::sampled_token next;
  /// Context tokens taken from the cluster KV cache instead of computed.
  std::uint64_t cached_tokens = 0;
  /// The context's KV, exported from the device (real jobs; empty in the simulated world).
  /// An in-process handle, not serialised: across processes the link port moves the bytes.
  runtime::kv_snapshot_ptr kv;
  /// Across processes: where the fabric link offers the KV's bytes (`troupe launch`'s KV
  /// bridge sets it; empty id 0 in one process and in the simulated world).
  runtime::fabric_ticket kv_ticket{};
  /// A streaming job (prefill_job::stream_kv): `kv` holds blocks from this one on (its
  /// blocks[0] is this block); the ones before went out as prefill_kv_part runs (in the
  /// simulated world, would have: the hand-off moves only the rest's bytes).
  std::uint64_t kv_first_block = 0;
  /// Across processes: where those runs are offered, in order (the KV bridge sets them); the
  /// decode side joins them to `kv_ticket`'s bytes.
  std::vector<kv_part> kv_parts{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_done& x) {
  return f(caf::meta::type_name("prefill_done"), x.request, x.instance, x.started, x.finished,
           x.next, x.cached_tokens, x.kv_ticket, x.kv_first_block, x.kv_parts);
}

/// Work counters of an engine (prefill or decode).
struct engine_stats {
  instance_id instance = 0;
  std::uint64_t steps = 0;
  std::uint64_t tokens = 0;
  std::uint64_t jobs_done = 0;
  /// Jobs accepted and not finished.
  std::uint64_t jobs_in_flight = 0;
  /// Device time spent in steps (for utilisation).
  runtime::duration busy{0};
  /// Decode: steps built while the previous one ran or at its end (the batch had work
  /// throughout), and the device's idle time before them: what the scheduler cost the device.
  std::uint64_t chained_steps = 0;
  runtime::duration stalled{0};
  /// Decode with speculation: sequence-steps that verified drafts, drafts verified, and drafts
  /// accepted.
  std::uint64_t verify_steps = 0;
  std::uint64_t drafts_verified = 0;
  std::uint64_t drafts_accepted = 0;
  /// Decode: handed-off KV the device refused (checksum mismatch, another model's); those
  /// jobs recomputed their context instead.
  std::uint64_t kv_import_failures = 0;
  /// Prefill, real world: context tokens taken from the store instead of computed; blocks
  /// fetched and blocks the store could not serve (missing, expired or corrupt); restores
  /// the device refused (the job then computed its whole context).
  std::uint64_t cached_tokens = 0;
  std::uint64_t blocks_fetched = 0;
  std::uint64_t fetch_misses = 0;
  std::uint64_t restore_failures = 0;
  /// Prefill, real world: restores whose window state came from another instance's kept
  /// copy (kept_state_get), and asks for one that found none (gone, dropped, timed out).
  std::uint64_t kept_pulled = 0;
  std::uint64_t kept_misses = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_stats& x) {
  return f(caf::meta::type_name("engine_stats"), x.instance, x.steps, x.tokens, x.jobs_done,
           x.jobs_in_flight, x.busy, x.chained_steps, x.stalled, x.verify_steps, x.drafts_verified, x.drafts_accepted,
           x.kv_import_failures, x.cached_tokens, x.blocks_fetched, x.fetch_misses,
           x.restore_failures, x.kept_pulled, x.kept_misses);
}

using engine_stats_atom = caf::atom_constant<caf::atom("engstats")>;

/// A leave notice with a grace period (both engines). Prefill: the engine calls its `leave`
/// callback at once (prefill_lb excludes the instance), finishes every job it holds (and any
/// routed to it before the exclusion), then answers 0 (it forwards nothing: its jobs are
/// short); the caller stops the instance. The grace does not cut a prefill short.
using drain_atom = caf::atom_constant<caf::atom("drain")>;

using prefill_engine_actor
  = caf::typed_actor<caf::replies_to<prefill_job>::with<prefill_done>,
                     caf::replies_to<engine_stats_atom>::with<engine_stats>,
                     caf::replies_to<drain_atom, runtime::duration>::with<std::uint64_t>,
                     caf::reacts_to<cancel_atom, std::uint64_t>,
                     caf::replies_to<kept_state_get>::with<kept_state>>;

struct prefill_engine_params {
  instance_id instance = 0;
  /// Tokens per device step (chunked prefill budget), over the whole instance.
  std::uint64_t step_tokens = 16384;
  /// Layers the fetched KV streams in by (the first must arrive before compute starts).
  std::uint32_t fetch_layers = 40;
  /// Tokens recomputed at the end of a prompt even when all of it is cached: the sliding
  /// window KV is not persisted, so it is rebuilt by bounded replay.
  std::uint64_t replay_tokens = 128;
  /// The simulated world's alternative to bounded replay (0: bounded replay): a cached
  /// prefix's window state rebuilt exactly, layer by layer over its receptive field in a model
  /// of this many layers. Layer l (1-based) recomputes the prefix's last min(cached, (layers −
  /// l + 1) · replay_tokens) tokens (each layer's window looks one window further back), so
  /// the job computes its uncached tail plus those token-layers / layers tokens (rounded up).
  std::uint32_t exact_rebuild_layers = 0;
  /// Called once per job the engine takes, with the tokens it computes for it (its uncached
  /// part and the window state's rebuild; the simulation's report; may be empty).
  std::function<void(std::uint64_t)> on_job;
  /// Speculative decoding downstream: every chunk asks the device for the request's DSpark
  /// draft context too (step_sequence::propose), so that the KV hand-off carries it and the
  /// decode instance drafts from the prompt at once. (The proposal the last chunk answers is
  /// not used: the decode instance's first step asks again.)
  bool draft_context = false;
  /// Real world: the cluster KV cache. With a valid `writer.store` and `writer.kv`, a job
  /// with a chain fetches its cached blocks from the store and persists the blocks it
  /// computed (through a block writer of its own); otherwise it computes its whole context.
  block_writer_params writer;
  /// Real world: told the key each time the device is asked to keep a prefix's window state
  /// (prefill_instance has it send prefill_kept to the balancer); null: nobody is told.
  std::function<void(const block_key&)> kept;
  /// How long a job waits for another instance's kept window state before it replays.
  runtime::duration kept_timeout = std::chrono::seconds(5);
};

/// What an exact rebuild of a `cached`-token prefix's window state costs, in tokens through
/// the whole model, for a model of `layers` layers with windows of `window` tokens: layer l
/// (1-based) recomputes the prefix's last min(cached, (layers − l + 1) · window) tokens, so the
/// token-layers over `layers`, rounded up (prefill_engine_params::exact_rebuild_layers). 0 for
/// no layers or nothing cached.
std::uint64_t exact_rebuild_tokens(std::uint64_t cached, std::uint32_t layers,
                                   std::uint64_t window);

/// Spawns a prefill engine that runs its steps on `device` (the instance's leader rank) and
/// fetches cached KV over `fetch_link` (store → host → device). `leave` is called when a
/// drain starts (the instance tells its balancer to exclude it); may be empty.
prefill_engine_actor spawn_prefill_engine(caf::local_actor* parent, prefill_engine_params params,
                                          runtime::device_port device,
                                          runtime::link_port fetch_link,
                                          std::function<void()> leave = {});

} // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::prefill_kv_part)

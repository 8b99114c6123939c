// kv_bridge: a request's KV between the processes of a launched cluster, over the fabric link.
//
// Inside one process a prefill engine hands the KV it exported to the decode engine as an
// in-process handle (prefill_done::kv → decode_job::kv), and a draining decode engine hands a
// request's KV on the same way (decode_done::kv). Between processes a handle means nothing, so
// `troupe node` puts a bridge in front of each engine, and announces the bridge to the
// balancer in its place:
// - in front of a prefill engine, a prefill_done that carries KV has its snapshot serialised
//   and offered on the process's fabric link (ports/fabric_link.hpp); the answer carries the
//   ticket (prefill_done::kv_ticket) instead of the handle. With `stream`, the bridge has its
//   engine stream each job's full blocks as its chunks complete them (prefill_kv_part): each
//   run is offered at once, and the decode bridge the request booked (prefill_job::kv_to) is
//   told (kv_part_offered) and pulls it while the prefill goes on; the answer then carries the
//   rest's ticket and the runs' (prefill_done::kv_parts);
// - in front of a decode engine, a decode_job with a ticket and no handle first pulls the
//   bytes from the ticket's endpoint and rebuilds the snapshot, its runs of blocks joined
//   before the rest (those pulled early taken from the bridge's table; a pull that fails, or
//   runs that do not join up, leave the job without KV: the engine recomputes the context,
//   as after a refused import); a
//   forwarded decode_done (drain) has its KV offered like prefill's. Progress notices, which
//   the engine sends to its job's sender (the bridge), go on to the requester;
// - window-state pulls (prefill_job::keeper, kept_state_get): a prefill job whose keeper is in
//   another process has the keeper replaced by the bridge, so its engine asks the bridge,
//   which asks the keeper (the keeper process's bridge) and pulls the ticket it answers; asked
//   by another process for its own engine's kept state, a bridge (prefill or decode: a decode
//   instance keeps the window states at the block boundaries its steps end on) offers it like
//   a hand-off.
// The engines and the request actors are unchanged; the control messages stay small, the
// bytes go over the fabric. An offer is withdrawn once pulled, or after `offer_ttl`.
//
// A structured-output request's constraint lives in the control process's table, where the
// entrypoint compiled it; the devices of this process sample from this process's table. So a
// job that carries a constraint (prefill_job::constraint, decode_job::constraint) has it
// rebuilt here (constraint_table::restore): compiled (cached by format) and fed the output
// tokens drawn so far elsewhere (a prefill's first token, the tokens before a forward or a
// reroute), and forgotten when the job ends. A format new to this process is compiled on the
// table's compile threads while the job goes on to its KV pull and engine (a device that reaches
// the first constrained token waits there for the compile). A constraint that cannot be rebuilt
// fails the job (the request is rerouted, then fails) rather than generating unconstrained:
// before it runs when that is known at once, else by cancelling it at its engine, whose answer
// the bridge then replaces by the error.
#pragma once

#include "actors/engine/decode_engine.hpp"
#include "actors/entrypoint/structured_output.hpp"
#include "actors/engine/prefill_engine.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/metrics.hpp"
#include "runtime/ports/fabric.hpp"

#include <caf/fwd.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace troupe::cluster {

/// A fresh id for an offer on this process's fabric link (the bridges and the store proxy
/// share the link, so they share the ids): 64 random bits, never 0, so that only a holder of
/// the offer's ticket can pull it.
std::uint64_t next_offer_id();

/// A snapshot as one byte string (its model name, length, blocks, State and SWA KV with
/// their checksums), and back. decode_snapshot returns nothing for bytes that are not one.
std::string encode_snapshot(const runtime::kv_snapshot& s);
std::optional<runtime::kv_snapshot> decode_snapshot(std::string_view bytes);

/// What a bridge moved (shared with its process, which reads them while it drains and when it
/// stops), and the decode jobs it holds and the offers it is making now.
struct kv_bridge_counters {
  std::atomic<std::uint64_t> offered{0}, offered_bytes{0};
  std::atomic<std::uint64_t> pulled{0}, pulled_bytes{0}, pull_failures{0};
  /// Runs of blocks pulled while their request's prefill still computed (of `pulled`).
  std::atomic<std::uint64_t> pulled_early{0};
  std::atomic<std::uint64_t> jobs{0}, offering{0};
};

struct kv_bridge_params {
  runtime::fabric_link_port link;
  /// An offer nobody pulled is withdrawn after this long.
  std::chrono::seconds offer_ttl{120};
  /// A pull that takes longer fails (the job recomputes).
  std::chrono::seconds pull_timeout{30};
  std::shared_ptr<kv_bridge_counters> counters;
  /// A prefill bridge has its engine stream each job's full blocks as its chunks compute them
  /// (prefill_job::stream_kv), and offers them at once; off: one offer after the prefill.
  bool stream = true;
  /// Counts the runs of blocks a decode bridge pulled while their prefill computed (as
  /// kv_bridge_counters::pulled_early), for /metrics; null: not counted there.
  runtime::counter* runs_pulled_early = nullptr;
  /// Told each problem an operator should see (a pull that failed), as one line without its
  /// end; called on the bridge's thread. Null: nothing is said.
  std::function<void(const std::string&)> warn;
  /// The table this process's devices sample constrained requests from (null: a job with a
  /// constraint fails).
  std::shared_ptr<actors::constraint_table> constraints;
};

/// A bridge in front of `engine`, with the engine's interface; it exits with the engine.
actors::prefill_engine_actor spawn_prefill_bridge(caf::actor_system& sys,
                                                  actors::prefill_engine_actor engine,
                                                  kv_bridge_params params);
actors::decode_engine_actor spawn_decode_bridge(caf::actor_system& sys,
                                                actors::decode_engine_actor engine,
                                                kv_bridge_params params);

} // namespace troupe::cluster

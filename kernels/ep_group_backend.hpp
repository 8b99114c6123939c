// An instance's expert-parallel group on the CPU: its ranks as threads of one process, each a
// model of the same checkpoint holding only the routed experts its rank is given
// (model_options::ep), the rest of the model whole.
//
// Every call that changes a sequence runs on every rank at once, each on a thread of its own
// (the ranks meet at every MoE in their exchange, kernels/ep_exchange.hpp), so the ranks' caches
// stay the same; calls that only read (lengths, KV exports, the router's counts) ask rank 0,
// and so do the DSpark draft calls (the draft layers' experts are not placed: every rank
// holds them, and rank 0 alone keeps the draft contexts). Answers are rank 0's.
//
// One communication domain: when any rank's call fails, the group aborts its exchange (the
// ranks waiting in it return) and fails that call and every later one ("the EP group
// failed: ..."): its caches may differ between ranks. Its instance must re-form, as an instance
// whose GPU failed does (docs/faults.md, "EP resize on restart").
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/ep_dispatch.hpp"
#include "kernels/ep_exchange.hpp"
#include "kernels/ep_process.hpp"
#include "kernels/model.hpp"

namespace troupe::kernels {

/// Loads `placement.ranks` rank models of the checkpoint in `dir` with `options` (its `ep` is
/// set per rank; `expert_shards` must be 1; the ranks share every tensor they load through
/// `options.tensors`, a fresh cache when null), calls `prepare` on each (e.g. to set the Engram
/// token map; null: nothing) and returns their group as one backend. The group's ranks run on
/// `placement.ranks` threads, each rank's model with `options.threads` threads of its own, and
/// meet in `exchange` (null: a local_exchange of placement.ranks ranks).
///
/// With `peers` (kernels/ep_process.hpp), the ranks they hold run in those processes
/// (serve_ep_peer at the other end of each socket, which the group then owns) and this process
/// loads the others, rank 0 among them; the ranks meet in an exchange over the sockets (no
/// `exchange` may be given), and every call that changes a sequence is sent to each peer.
/// Returns once every peer has loaded.
///
/// Errors: a placement that does not fit the model, an exchange of another size, peers' ranks
/// that overlap or include rank 0, a load or `prepare` failure (naming the rank, a peer's
/// included), a peer gone before it loaded.
result<std::unique_ptr<model_backend>> open_ep_group(
  const std::filesystem::path& dir, model_options options, const expert_placement& placement,
  const std::function<result<bool>(model&)>& prepare = {},
  std::shared_ptr<ep_exchange> exchange = {}, std::vector<ep_peer> peers = {});

}  // namespace troupe::kernels

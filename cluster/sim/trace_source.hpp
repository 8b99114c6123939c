// trace_source: the simulated world's entrypoint: it admits a workload's requests at their
// arrival times and collects their outcomes.
//
// In the real world the HTTP entrypoint turns API calls into request actors. In the simulated
// world this actor does it from a trace: it keeps one timer for the next arrival (never the
// whole trace's worth), spawns a request actor for every request due, holds its handle until
// its outcome comes back, and appends each outcome to a log the simulation reads afterwards.
#pragma once

#include "actors/request/request.hpp"

#include <caf/fwd.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace troupe::cluster::sim {

/// One request to admit: its spec and its arrival time since the start of the run.
struct admission {
  runtime::duration arrival{};
  actors::request_spec spec;
};

/// What the source shares with the simulation that owns it (same thread in the sim world).
struct source_log {
  std::vector<actors::request_outcome> outcomes;
  std::uint64_t admitted = 0;
  /// The ids of the admitted requests, in admission order (for the invariant checker).
  std::vector<std::uint64_t> admitted_ids;
};

/// Yields the workload's admissions in arrival order, one per call; nullopt once it is
/// exhausted (and on every later call). The source pulls one admission ahead of the clock, so
/// a long workload is never held in memory whole.
using admission_stream = std::function<std::optional<admission>()>;

/// Spawns the source. It starts admitting at once (arrivals are relative to now) and stops
/// after the last outcome is in.
caf::actor spawn_trace_source(caf::actor_system& sys,
                              std::shared_ptr<const std::vector<admission>> workload,
                              actors::request_services services,
                              std::shared_ptr<source_log> log);

/// The same, pulling admissions from `next` as they fall due.
caf::actor spawn_trace_source(caf::actor_system& sys, admission_stream next,
                              actors::request_services services,
                              std::shared_ptr<source_log> log);

} // namespace troupe::cluster::sim

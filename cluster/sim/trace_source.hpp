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

#include <memory>
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
};

/// Spawns the source. It starts admitting at once (arrivals are relative to now) and stops
/// after the last outcome is in.
caf::actor spawn_trace_source(caf::actor_system& sys,
                              std::shared_ptr<const std::vector<admission>> workload,
                              actors::request_services services,
                              std::shared_ptr<source_log> log);

} // namespace troupe::cluster::sim

// The link port: how bulk data (KV blocks, hand-offs) moves between two places.
//
// A transfer is a request to the link port, answered when the bytes have arrived. The
// simulated link models a pipe of fixed bandwidth and one-way latency: transfers share the
// bandwidth in arrival order (one occupies the pipe for bytes / bandwidth) and each arrives
// `latency` after its last byte left. The real link (libfabric) implements the same
// interface.
#pragma once

#include "runtime/time.hpp"

#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>

namespace troupe::runtime {

/// A transfer of `bytes` bytes; `id` is echoed in the reply.
struct link_transfer {
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, link_transfer& x) {
  return f(caf::meta::type_name("link_transfer"), x.id, x.bytes);
}

/// A completed transfer: when its first byte left and when its last byte arrived.
struct link_delivery {
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
  time_point started{};
  time_point arrived{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, link_delivery& x) {
  return f(caf::meta::type_name("link_delivery"), x.id, x.bytes, x.started, x.arrived);
}

using link_port = caf::typed_actor<caf::replies_to<link_transfer>::with<link_delivery>>;

/// Parameters of a simulated link.
struct sim_link_params {
  /// Bytes per second; must be > 0.
  double bandwidth = 50e9;
  /// One-way latency added to every transfer.
  duration latency = std::chrono::microseconds(10);
};

/// A simulated link with the given bandwidth and latency.
link_port spawn_sim_link(caf::actor_system& sys, sim_link_params params);

} // namespace troupe::runtime

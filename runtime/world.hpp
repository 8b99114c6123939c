// world: one CAF actor system in the real or the simulated world.
//
// troupe runs the same actors in two worlds. In the real world the actor system uses CAF's
// work-stealing scheduler and the wall clock. In the simulated world it uses CAF's
// deterministic `test_coordinator`: one thread, a virtual clock, and a `sim_driver` that
// advances it. A world also carries the root of the seeded random streams and registers
// troupe's message types and error category. Actors are spawned into `world::system()` and
// never learn which world they are in: time, randomness and every outside effect reach them
// through the actor clock, the rng they are handed, and ports.
#pragma once

#include "runtime/log.hpp"
#include "runtime/random.hpp"
#include "runtime/sim_driver.hpp"
#include "runtime/time.hpp"
#include "runtime/transport.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace troupe::runtime {

enum class world_mode : std::uint8_t { real, sim };

std::string to_string(world_mode m);

struct world_options {
  world_mode mode = world_mode::sim;
  /// Seed of the root random stream.
  std::uint64_t seed = 0;
  /// Worker threads of the real world's scheduler (0 = CAF's default: one per core).
  std::size_t threads = 0;
  /// Load CAF's middleman (network transport between nodes, see transport.hpp); real world
  /// only: the simulated world never loads it and ignores this flag.
  bool network = false;
  /// Called on the configuration before the actor system starts: later layers register
  /// their type-id blocks and options here.
  std::function<void(caf::actor_system_config&)> configure;
  /// TLS for the network transport (mutual, CA-based; transport.hpp). Enabled TLS implies
  /// `network`. Real world only: the simulated world ignores it. The world does not check
  /// the files: call check_tls first (CAF aborts on unusable files at connection time).
  tls_options tls = {};
};

class world {
public:
  explicit world(world_options opts);

  /// Stops the actor system. In sim mode the virtual clock stops: pending timers are dropped,
  /// but messages already sent are still handled (a supervisor's kill to its children, exit
  /// and down messages), so that actors shut down and give their memory back.
  ~world();

  world(const world&) = delete;
  world& operator=(const world&) = delete;

  world_mode mode() const noexcept { return mode_; }

  caf::actor_system& system() noexcept { return *system_; }

  /// The root random stream; split it per actor / purpose (see rng::split).
  const rng& random() const noexcept { return root_; }

  /// Now on the actor clock (virtual in sim mode).
  time_point now() const;

  /// The simulation driver. Only in sim mode; calling it in real mode is an invariant
  /// violation.
  sim_driver& driver();

private:
  world_mode mode_;
  rng root_;
  std::unique_ptr<caf::actor_system_config> config_;
  std::unique_ptr<caf::actor_system> system_;
  std::unique_ptr<sim_driver> driver_;
  log::clock_setting previous_log_clock_;  // restored on destruction
};

} // namespace troupe::runtime

// Helpers for actor tests on the deterministic scheduler: a simulated world, a probe that
// asks an actor and keeps the reply, and a journal that actors and tests write to.
#pragma once

#include "runtime/world.hpp"

#include <caf/all.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace troupe::test {

using journal = std::shared_ptr<std::vector<std::string>>;

inline journal make_journal() {
  return std::make_shared<std::vector<std::string>>();
}

struct sim_fixture {
  runtime::world world{runtime::world_options{runtime::world_mode::sim, 42, 0, false, nullptr}};
  caf::actor_system& sys = world.system();

  /// Runs until nothing is left to do.
  runtime::stop_reason run() { return world.driver().run(); }

  /// Runs for `d` of virtual time.
  runtime::stop_reason run_for(runtime::duration d) { return world.driver().run_for(d); }

  /// Virtual seconds since the world started.
  double seconds() const {
    return runtime::to_seconds(world.now() - start);
  }

  /// Sends `xs` to `dest` from a probe actor and keeps the reply (or the error) and the
  /// virtual instant it arrived. The reply is there once the world has run far enough.
  template <class T>
  struct answer {
    std::shared_ptr<std::optional<T>> value = std::make_shared<std::optional<T>>();
    std::shared_ptr<caf::error> error = std::make_shared<caf::error>();
    std::shared_ptr<std::optional<runtime::time_point>> at =
      std::make_shared<std::optional<runtime::time_point>>();
    bool ready() const { return value->has_value() || static_cast<bool>(*error); }
    /// Virtual seconds from `origin` to the arrival of the reply (or error); -1 if none yet.
    double seconds_since(runtime::time_point origin) const {
      return at->has_value() ? runtime::to_seconds(**at - origin) : -1.0;
    }
  };

  template <class T, class Handle, class... Ts>
  answer<T> ask(const Handle& dest, Ts... xs) {
    answer<T> a;
    sys.spawn([dest, a, xs...](caf::event_based_actor* self) {
      self->request(dest, caf::infinite, xs...)
        .then(
          [a, self](T& x) {
            *a.at = self->clock().now();
            *a.value = std::move(x);
          },
          [a, self](caf::error& e) {
            *a.at = self->clock().now();
            *a.error = std::move(e);
          });
    });
    return a;
  }

  runtime::time_point start = world.now();
};

} // namespace troupe::test

#include "runtime/sim_driver.hpp"

#include "runtime/check.hpp"

#include <caf/actor_system.hpp>
#include <caf/scheduler/test_coordinator.hpp>

namespace troupe::runtime {

const char* to_string(stop_reason r) {
  switch (r) {
    case stop_reason::quiescent:
      return "quiescent";
    case stop_reason::deadline:
      return "deadline";
    case stop_reason::stopped:
      return "stopped";
  }
  return "?";
}

namespace {

caf::scheduler::test_coordinator& coordinator_of(caf::actor_system& sys) {
  auto* sched = dynamic_cast<caf::scheduler::test_coordinator*>(&sys.scheduler());
  TROUPE_CHECK(sched != nullptr, "sim_driver needs a world in sim mode (test_coordinator)");
  return *sched;
}

} // namespace

sim_driver::sim_driver(caf::actor_system& sys)
  : sched_(coordinator_of(sys)), start_(sched_.clock().now()), next_progress_(start_) {
}

time_point sim_driver::now() const noexcept {
  return sched_.clock().now();
}

stop_reason sim_driver::run() {
  return drive(std::nullopt);
}

stop_reason sim_driver::run_until(time_point deadline) {
  return drive(deadline);
}

stop_reason sim_driver::run_for(duration d) {
  return drive(now() + d);
}

void sim_driver::on_progress(duration every, std::function<void(const sim_progress&)> fn) {
  progress_every_ = every;
  progress_ = std::move(fn);
  next_progress_ = now() + every;
}

void sim_driver::report(std::optional<time_point> deadline) {
  if (!progress_)
    return;
  sim_progress p{elapsed(), events_, std::nullopt};
  if (deadline)
    p.deadline = *deadline - start_;
  progress_(p);
}

stop_reason sim_driver::drive(std::optional<time_point> deadline) {
  auto& clock = sched_.clock();
  auto finish = [&](stop_reason r) {
    stop_requested_ = false;
    report(deadline);
    return r;
  };
  for (;;) {
    // Every ready message first: they all happen "now".
    while (sched_.try_run_once()) {
      ++events_;
      if (stop_requested_)
        return finish(stop_reason::stopped);
    }
    if (!clock.has_pending_timeout()) {
      if (deadline && clock.current_time < *deadline)
        clock.current_time = *deadline;
      return finish(stop_reason::quiescent);
    }
    auto due = clock.schedule().begin()->first;
    if (deadline && due > *deadline) {
      if (clock.current_time < *deadline)
        clock.current_time = *deadline;
      return finish(stop_reason::deadline);
    }
    if (progress_ && progress_every_.count() > 0 && due >= next_progress_) {
      // Report at the last interval mark the clock passes on its way to `due`, with the clock
      // standing on that mark: nothing is due before `due`, so the world is as it is there,
      // and the callback sees at least `every` more virtual time than at its last call.
      auto mark = next_progress_ + ((due - next_progress_) / progress_every_) * progress_every_;
      if (clock.current_time < mark)
        clock.current_time = mark;
      report(deadline);
      next_progress_ = mark + progress_every_;
    }
    clock.trigger_timeout();
    ++events_;
    if (stop_requested_)
      return finish(stop_reason::stopped);
  }
}

} // namespace troupe::runtime

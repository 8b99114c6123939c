#include "runtime/sim_driver.hpp"

#include "runtime/check.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_cast.hpp>
#include <caf/atom.hpp>
#include <caf/detail/simple_actor_clock.hpp>
#include <caf/local_actor.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/type_nr.hpp>

#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <tuple>

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

namespace {

std::string demangle(const std::type_info& t) {
  int status = 0;
  char* name = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : t.name();
  std::free(name);
  // Drop the namespaces: "troupe::actors::decode_job" reads as "decode_job".
  if (out.find('<') == std::string::npos)
    if (auto colon = out.rfind("::"); colon != std::string::npos)
      out = out.substr(colon + 2);
  return out;
}

const char* name_of(const caf::strong_actor_ptr& p) {
  if (auto* a = dynamic_cast<caf::local_actor*>(caf::actor_cast<caf::abstract_actor*>(p)))
    return a->name();
  return "?";
}

/// What a pending timer is (a delayed message, a request's timeout, an actor's own timeout)
/// and whom it reaches.
std::pair<const char*, const char*>
timer_of(const caf::detail::simple_actor_clock::delayed_event& e) {
  using clk = caf::detail::simple_actor_clock;
  switch (e.subtype) {
    case clk::actor_msg_type:
      return {"delayed message", name_of(static_cast<const clk::actor_msg&>(e).receiver)};
    case clk::request_timeout_type:
      return {"request timeout", name_of(static_cast<const clk::request_timeout&>(e).self)};
    case clk::ordinary_timeout_type:
      return {"timeout", name_of(static_cast<const clk::ordinary_timeout&>(e).self)};
    case clk::multi_timeout_type:
      return {"timeout", name_of(static_cast<const clk::multi_timeout&>(e).self)};
    default:
      return {"group message", "?"};
  }
}

} // namespace

bool sim_driver::run_one_profiled() {
  const char* actor = "?";
  const void* type = nullptr;
  std::uint64_t atom = 0;
  const caf::mailbox_element* next = nullptr;
  if (!sched_.jobs.empty()) {
    if (auto* a = dynamic_cast<caf::local_actor*>(sched_.jobs.front())) {
      actor = a->name();
      next = a->peek_at_next_mailbox_element();
    }
  }
  const char* builtin = nullptr;
  if (next != nullptr && next->content().size() > 0) {
    const auto& c = next->content();
    if (c.match_element<caf::atom_value>(0))
      atom = static_cast<std::uint64_t>(c.get_as<caf::atom_value>(0));
    auto [nr, info] = c.type(0);
    if (nr != 0 && nr < caf::type_nrs)
      type = builtin = caf::numbered_type_names[nr - 1];
    else
      type = info;
  }
  auto start = std::chrono::steady_clock::now();
  bool ran = sched_.try_run_once();
  if (!ran)
    return false;
  auto& row = rows_[profile_key{actor, type, atom}];
  if (row.count == 0) {
    row.actor = actor;
    if (atom != 0)
      row.message = "(" + caf::to_string(static_cast<caf::atom_value>(atom)) + ")";
    else if (builtin != nullptr)
      row.message = builtin; // CAF's name of a built-in type, e.g. "@str"
    else if (type != nullptr)
      row.message = demangle(*static_cast<const std::type_info*>(type));
    else
      row.message = "(no message)";
  }
  ++row.count;
  row.wall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return true;
}

std::vector<sim_profile_row> sim_driver::profile() const {
  std::vector<sim_profile_row> out;
  for (auto& [key, row] : rows_)
    out.push_back(row);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.count != b.count)
      return a.count > b.count;
    return std::tie(a.actor, a.message) < std::tie(b.actor, b.message);
  });
  return out;
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
    while (profiling_ ? run_one_profiled() : sched_.try_run_once()) {
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
    if (profiling_) {
      auto [kind, receiver] = timer_of(*clock.schedule().begin()->second);
      auto start = std::chrono::steady_clock::now();
      clock.trigger_timeout();
      auto& row = rows_[profile_key{receiver, kind, 1}];
      if (row.count == 0) {
        row.actor = "clock";
        row.message = std::string{kind} + " for " + receiver;
      }
      ++row.count;
      row.wall_s
        += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } else {
      clock.trigger_timeout();
    }
    ++events_;
    if (stop_requested_)
      return finish(stop_reason::stopped);
  }
}

} // namespace troupe::runtime

#include "runtime/world.hpp"

#include "runtime/check.hpp"
#include "runtime/errors.hpp"
#include "runtime/log.hpp"
#include "runtime/metrics.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/fabric.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/ports/store.hpp"
#include "runtime/supervisor.hpp"
#include "runtime/type_ids.hpp"

#include <caf/scheduler/test_coordinator.hpp>

namespace troupe::runtime {

std::string to_string(world_mode m) {
  return m == world_mode::real ? "real" : "sim";
}

namespace {

/// Renders an error of one of troupe's categories: "<category>: <code name> (<context>)".
template <class Code>
caf::actor_system_config::error_renderer renderer(std::string category) {
  return [category](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
    auto text = category + ": " + to_string(static_cast<Code>(code));
    if (ctx.match_elements<std::string>())
      text += " (" + ctx.get_as<std::string>(0) + ")";
    return text;
  };
}

std::unique_ptr<caf::actor_system_config> make_config(const world_options& opts) {
  auto cfg = std::make_unique<caf::actor_system_config>();
  cfg->add_message_types<caf::id_block::troupe_runtime>();
  cfg->add_error_category(error_category, renderer<errc>("troupe"));
  cfg->add_error_category(metrics_error_category, renderer<metrics_errc>("metrics"));
  cfg->add_error_category(device_error_category, renderer<device_errc>("device"));
  if (opts.mode == world_mode::sim) {
    cfg->set("scheduler.policy", caf::atom("testing"));
  } else {
    if (opts.threads > 0)
      cfg->set("scheduler.max-threads", opts.threads);
    if (opts.network || opts.tls.enabled())
      configure_transport(*cfg, opts.tls);
  }
  if (opts.configure)
    opts.configure(*cfg);
  return cfg;
}

} // namespace

world::world(world_options opts)
  : mode_(opts.mode), root_(opts.seed), config_(make_config(opts)),
    system_(std::make_unique<caf::actor_system>(*config_)) {
  if (mode_ == world_mode::sim) {
    driver_ = std::make_unique<sim_driver>(*system_);
    // Nobody runs the actors once the driver stops: waiting for them would never end.
    system_->await_actors_before_shutdown(false);
  }
  previous_log_clock_ = log::set_clock({&system_->clock(), mode_ == world_mode::sim, system_->clock().now()});
}

world::~world() {
  log::set_clock(previous_log_clock_);
  driver_.reset();
  if (mode_ == world_mode::sim) {
    // The test_coordinator's stop() (run by ~actor_system) loops "run every job, fire every
    // timer" until nothing is left, so a periodic actor would keep the destructor busy for
    // ever. Drop every timer first: no virtual time passes any more. The messages already
    // sent are still handled, though (no time passes for them either): dropping them with
    // their jobs would leave the actors that should have handled them alive for ever, since
    // a mailbox keeps its messages and actors in a simulation hold each other's handles (a
    // supervisor's kill to its children, exit and down messages). Such actors never shut
    // down and kept their state, about 0.5 MB per run (mostly KV block tables) in a swarm.
    // Handling a message may set a timer (dropped in the next round) or send more messages;
    // after `max_teardown_events` the rest are dropped, in case actors ping-pong for ever.
    auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(system_->scheduler());
    constexpr std::size_t max_teardown_events = 1'000'000;
    std::size_t events = 0;
    while (sched.clock().has_pending_timeout() || !sched.jobs.empty()) {
      sched.clock().cancel_all();
      while (events < max_teardown_events && sched.try_run_once())
        ++events;
      while (!sched.jobs.empty()) {
        auto* job = sched.jobs.front();
        sched.jobs.pop_front();
        intrusive_ptr_release(job); // the reference the scheduler held for the job
      }
    }
  }
  system_.reset();
}

time_point world::now() const {
  return system_->clock().now();
}

sim_driver& world::driver() {
  TROUPE_CHECK(driver_ != nullptr, "world::driver() is only available in sim mode");
  return *driver_;
}

} // namespace troupe::runtime

#include "actors/request/engine_watch.hpp"

#include <caf/abstract_actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/actor_control_block.hpp>
#include <caf/system_messages.hpp>
#include <caf/exit_reason.hpp>
#include <caf/message.hpp>
#include <caf/message_id.hpp>

#include <utility>

namespace troupe::actors {

engine_watch::ticket::ticket(ticket&& other) noexcept
  : registry_(std::move(other.registry_)),
    engine_(std::exchange(other.engine_, caf::actor_addr{})),
    watcher_(other.watcher_) {}

engine_watch::ticket& engine_watch::ticket::operator=(ticket&& other) noexcept {
  if (this != &other) {
    reset();
    registry_ = std::move(other.registry_);
    engine_ = std::exchange(other.engine_, caf::actor_addr{});
    watcher_ = other.watcher_;
  }
  return *this;
}

void engine_watch::ticket::reset() {
  if (!engine_)
    return;
  if (auto registry = registry_.lock())
    registry->unwatch(engine_, watcher_);
  engine_ = caf::actor_addr{};
}

engine_watch::ticket engine_watch::watch(const caf::actor_addr& engine,
                                         const caf::actor_addr& watcher) {
  ticket t;
  t.registry_ = weak_from_this();
  t.engine_ = engine;
  t.watcher_ = watcher.id();
  bool first = false;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto [it, inserted] = engines_.try_emplace(engine);
    first = inserted;
    it->second.watchers.emplace(watcher.id(), watcher);
  }
  if (first) {
    // One functor per engine for as long as it lives (an engine that already terminated
    // runs it at once, as it would answer a monitor).
    auto ptr = caf::actor_cast<caf::strong_actor_ptr>(engine);
    if (!ptr) {
      engine_down(engine, caf::exit_reason::unknown, nullptr);
    } else {
      std::weak_ptr<engine_watch> registry = weak_from_this();
      ptr->get()->attach_functor(
        [registry, engine](const caf::error& reason, caf::execution_unit* host) {
          if (auto self = registry.lock())
            self->engine_down(engine, reason, host);
        });
    }
  }
  return t;
}

void engine_watch::unwatch(const caf::actor_addr& engine, caf::actor_id watcher) {
  std::lock_guard<std::mutex> guard(mutex_);
  // The entry stays while its engine lives: its functor is attached once.
  if (auto it = engines_.find(engine); it != engines_.end())
    it->second.watchers.erase(watcher);
}

void engine_watch::engine_down(const caf::actor_addr& engine, const caf::error& reason,
                               caf::execution_unit* host) {
  std::map<caf::actor_id, caf::actor_addr> watchers;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = engines_.find(engine);
    if (it == engines_.end())
      return;
    watchers = std::move(it->second.watchers);
    engines_.erase(it);
  }
  for (const auto& [id, addr] : watchers)
    if (auto to = caf::actor_cast<caf::strong_actor_ptr>(addr))
      to->enqueue(caf::actor_cast<caf::strong_actor_ptr>(engine), caf::make_message_id(),
                  caf::make_message(caf::down_msg{engine, reason}), host);
}

std::size_t engine_watch::size() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::size_t n = 0;
  for (const auto& [engine, e] : engines_)
    n += e.watchers.size();
  return n;
}

} // namespace troupe::actors

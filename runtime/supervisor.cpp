#include "runtime/supervisor.hpp"

#include "runtime/check.hpp"
#include "runtime/errors.hpp"
#include "runtime/log.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/response_promise.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <list>
#include <map>

namespace troupe::runtime {

std::string to_string(strategy s) {
  switch (s) {
    case strategy::one_for_one:
      return "one_for_one";
    case strategy::one_for_all:
      return "one_for_all";
    case strategy::rest_for_one:
      return "rest_for_one";
  }
  return "?";
}

std::string to_string(restart_policy p) {
  switch (p) {
    case restart_policy::permanent:
      return "permanent";
    case restart_policy::transient:
      return "transient";
    case restart_policy::temporary:
      return "temporary";
  }
  return "?";
}

std::string to_string(supervisor_event_kind k) {
  switch (k) {
    case supervisor_event_kind::started:
      return "started";
    case supervisor_event_kind::exited:
      return "exited";
    case supervisor_event_kind::restarted:
      return "restarted";
    case supervisor_event_kind::escalated:
      return "escalated";
  }
  return "?";
}

namespace {

using restart_timer_atom = caf::atom_constant<caf::atom("sv_restart")>;
using kill_timer_atom = caf::atom_constant<caf::atom("sv_kill")>;

enum class child_status { running, stopping, down, restart_pending };

struct child_entry {
  child_spec spec;
  caf::actor handle;
  child_status status = child_status::down;
  std::uint32_t restarts = 0;
  /// Restarts since the child last stayed up for a whole period (drives the backoff).
  std::uint32_t consecutive = 0;
  time_point last_start{};
  /// Bumped at every start, so that stale deferred work can be recognised.
  std::uint64_t generation = 0;
  /// Bumped at every stop request, so that a stale kill timer is ignored.
  std::uint64_t stop_token = 0;
};

struct supervisor_state {
  std::string sup_name;
  supervisor_flags flags;
  /// In start order; the indexes find a child by id and by the address of its running actor
  /// without a scan (a supervisor may hold thousands of children).
  std::list<child_entry> children;
  std::map<std::string, std::list<child_entry>::iterator> by_id;
  std::map<caf::actor_addr, std::list<child_entry>::iterator> by_addr;
  std::deque<time_point> restart_times;
  std::vector<caf::actor> subscribers;
  // The stop sequence in progress, if any: ids in the order they are stopped.
  bool busy = false;
  std::deque<std::string> stop_queue;
  std::function<void()> after_stop;
  // Work that arrived while a stop sequence was running.
  std::deque<std::function<void()>> deferred;
  // Delayed restarts: token -> ids (in start order).
  std::map<std::uint64_t, std::vector<std::string>> pending_restarts;
  std::uint64_t next_token = 1;
  bool shutting_down = false;
  std::shared_ptr<spdlog::logger> log;

  /// Runs when the supervisor terminates. After an orderly shutdown no child is left; if the
  /// supervisor was killed, its children die with it (the supervision tree never leaks).
  ~supervisor_state() {
    for (auto& c : children)
      if (c.handle)
        caf::anon_send_exit(c.handle, caf::exit_reason::kill);
  }

  static inline const char* name = "supervisor";
};

using sup_actor = caf::stateful_actor<supervisor_state>;
using child_iter = std::list<child_entry>::iterator;

child_entry* find(sup_actor* self, const std::string& id) {
  auto i = self->state.by_id.find(id);
  return i == self->state.by_id.end() ? nullptr : &*i->second;
}

child_entry* find(sup_actor* self, const caf::actor_addr& addr) {
  auto i = self->state.by_addr.find(addr);
  return i == self->state.by_addr.end() ? nullptr : &*i->second;
}

/// Appends a child (not started) and indexes it by id.
child_iter add_child(sup_actor* self, child_spec spec) {
  auto& st = self->state;
  auto it = st.children.insert(st.children.end(), child_entry{std::move(spec), caf::actor{}});
  st.by_id.emplace(it->spec.id, it);
  return it;
}

/// Forgets a child (which must not be running).
void remove_child(sup_actor* self, child_iter it) {
  auto& st = self->state;
  st.by_id.erase(it->spec.id);
  st.children.erase(it);
}

/// Forgets the running actor of a child (it exited).
void clear_handle(sup_actor* self, child_entry& c) {
  if (c.handle)
    self->state.by_addr.erase(c.handle.address());
  c.handle = nullptr;
}

std::string render(sup_actor* self, const caf::error& reason) {
  if (!reason)
    return "normal";
  return self->system().render(reason);
}

void emit(sup_actor* self, supervisor_event_kind kind, const std::string& child,
          std::string reason, std::uint32_t restarts) {
  auto& st = self->state;
  supervisor_event ev{st.sup_name,
                      kind,
                      child,
                      std::move(reason),
                      self->clock().now().time_since_epoch().count(),
                      restarts};
  st.log->debug("{}: {} {}{}{}", st.sup_name, to_string(kind), child, ev.reason.empty() ? "" : ": ",
                ev.reason);
  for (auto& sub : st.subscribers)
    self->send(sub, ev);
}

bool abnormal(const caf::error& reason) {
  return reason && reason != caf::exit_reason::user_shutdown;
}

/// Starts the child at `it`; returns false if its start function gave no actor.
bool start(sup_actor* self, child_iter it) {
  auto& c = *it;
  auto handle = c.spec.start ? c.spec.start(self) : caf::actor{};
  if (!handle) {
    c.status = child_status::down;
    return false;
  }
  c.handle = std::move(handle);
  c.status = child_status::running;
  c.last_start = self->clock().now();
  ++c.generation;
  self->state.by_addr.emplace(c.handle.address(), it);
  self->monitor(c.handle);
  return true;
}

void run_deferred(sup_actor* self);
void handle_failure(sup_actor* self, const std::string& id, const caf::error& reason);

/// Handles the failure of child `id` now, or after the stop sequence in progress (unless the
/// child was restarted in between).
void fail(sup_actor* self, const std::string& id, const caf::error& reason) {
  auto& st = self->state;
  if (!st.busy) {
    handle_failure(self, id, reason);
    return;
  }
  auto* c = find(self, id);
  auto generation = c != nullptr ? c->generation : 0;
  st.deferred.push_back([self, id, reason, generation] {
    auto* e = find(self, id);
    if (e != nullptr && e->generation == generation && !e->handle)
      handle_failure(self, id, reason);
  });
}

void stop_next(sup_actor* self) {
  auto& st = self->state;
  while (!st.stop_queue.empty()) {
    auto* c = find(self, st.stop_queue.front());
    if (c == nullptr || !c->handle || c->status == child_status::stopping) {
      if (c != nullptr && c->status == child_status::stopping)
        return; // wait for its exit
      if (c != nullptr && c->status == child_status::restart_pending)
        c->status = child_status::down;
      st.stop_queue.pop_front();
      continue;
    }
    c->status = child_status::stopping;
    auto token = ++c->stop_token;
    if (c->spec.shutdown.count() == 0) {
      self->send_exit(c->handle, caf::exit_reason::kill);
    } else {
      self->send_exit(c->handle, caf::exit_reason::user_shutdown);
      if (c->spec.shutdown != infinite_grace)
        self->delayed_send(self, c->spec.shutdown, kill_timer_atom::value, c->spec.id, token);
    }
    return;
  }
  st.busy = false;
  auto then = std::move(st.after_stop);
  st.after_stop = nullptr;
  if (then)
    then();
  run_deferred(self);
}

/// Stops the children `ids` one after another (each within its grace), then runs `then`.
void stop_children(sup_actor* self, std::vector<std::string> ids, std::function<void()> then) {
  auto& st = self->state;
  TROUPE_CHECK(!st.busy, "supervisor: overlapping stop sequences");
  st.busy = true;
  st.stop_queue.assign(ids.begin(), ids.end());
  st.after_stop = std::move(then);
  stop_next(self);
}

/// The ids of the running children from `first` on, in reverse start order.
std::vector<std::string> running_from(sup_actor* self, child_iter first) {
  std::vector<std::string> ids;
  auto& cs = self->state.children;
  for (auto i = cs.end(); i != first;) {
    --i;
    if (i->handle)
      ids.push_back(i->spec.id);
  }
  return ids;
}

std::vector<std::string> running_children(sup_actor* self) {
  return running_from(self, self->state.children.begin());
}

void shutdown(sup_actor* self, caf::error reason) {
  auto& st = self->state;
  if (st.shutting_down)
    return;
  st.shutting_down = true;
  st.pending_restarts.clear();
  auto go = [self, reason] {
    stop_children(self, running_children(self), [self, reason] { self->quit(reason); });
  };
  if (st.busy)
    st.deferred.push_front(go);
  else
    go();
}

void run_deferred(sup_actor* self) {
  auto& st = self->state;
  while (!st.busy && !st.deferred.empty()) {
    auto work = std::move(st.deferred.front());
    st.deferred.pop_front();
    work();
  }
}

void restart_now(sup_actor* self, const std::vector<std::string>& ids) {
  auto& st = self->state;
  if (st.shutting_down)
    return;
  std::vector<std::string> failed;
  for (auto& id : ids) { // in start order
    auto i = st.by_id.find(id);
    if (i == st.by_id.end() || i->second->handle)
      continue;
    auto& c = *i->second;
    ++c.restarts;
    ++c.consecutive;
    if (start(self, i->second))
      emit(self, supervisor_event_kind::restarted, c.spec.id, "", c.restarts);
    else
      failed.push_back(c.spec.id);
  }
  for (auto& id : failed) {
    auto reason = make_error(errc::child_start_failed, id);
    emit(self, supervisor_event_kind::exited, id, render(self, reason), find(self, id)->restarts);
    fail(self, id, reason);
  }
}

void schedule_restart(sup_actor* self, const std::string& failed_id,
                      std::vector<std::string> ids) {
  auto& st = self->state;
  auto* failed = find(self, failed_id);
  auto delay = st.flags.restart_delay;
  if (delay.count() > 0 && failed != nullptr && st.flags.backoff > 1.0) {
    auto factor = std::pow(st.flags.backoff, static_cast<double>(failed->consecutive));
    auto scaled = to_seconds(delay) * factor;
    delay = scaled >= to_seconds(st.flags.max_restart_delay) ? st.flags.max_restart_delay
                                                             : from_seconds(scaled);
  }
  if (delay.count() == 0) {
    restart_now(self, ids);
    return;
  }
  for (auto& id : ids)
    if (auto* c = find(self, id))
      c->status = child_status::restart_pending;
  auto token = st.next_token++;
  st.pending_restarts.emplace(token, std::move(ids));
  self->delayed_send(self, delay, restart_timer_atom::value, token);
}

void escalate(sup_actor* self) {
  auto& st = self->state;
  st.log->warn("{}: restart intensity {} in {} exceeded; escalating", st.sup_name,
               st.flags.intensity, to_seconds(st.flags.period));
  emit(self, supervisor_event_kind::escalated, "", "restart_intensity_exceeded", 0);
  shutdown(self, make_error(errc::restart_intensity_exceeded, st.sup_name));
}

void handle_failure(sup_actor* self, const std::string& id, const caf::error& reason) {
  auto& st = self->state;
  if (st.shutting_down)
    return;
  auto found = st.by_id.find(id);
  if (found == st.by_id.end())
    return;
  auto pos = found->second;
  auto& c = *pos;
  const auto policy = c.spec.restart;
  if (policy == restart_policy::temporary) {
    remove_child(self, pos);
    return;
  }
  if (policy == restart_policy::transient && !abnormal(reason)) {
    c.status = child_status::down;
    return;
  }
  auto now = self->clock().now();
  if (now - c.last_start >= st.flags.period)
    c.consecutive = 0;
  st.restart_times.push_back(now);
  while (!st.restart_times.empty() && now - st.restart_times.front() > st.flags.period)
    st.restart_times.pop_front();
  if (st.restart_times.size() > st.flags.intensity) {
    escalate(self);
    return;
  }
  std::vector<std::string> to_stop;
  std::vector<std::string> to_restart;
  switch (st.flags.how) {
    case strategy::one_for_one:
      to_restart.push_back(id);
      break;
    case strategy::one_for_all:
      to_stop = running_children(self);
      for (auto& other : st.children)
        to_restart.push_back(other.spec.id);
      break;
    case strategy::rest_for_one:
      to_stop = running_from(self, std::next(pos));
      for (auto i = pos; i != st.children.end(); ++i)
        to_restart.push_back(i->spec.id);
      break;
  }
  c.status = child_status::down;
  if (to_stop.empty()) {
    schedule_restart(self, id, std::move(to_restart));
    return;
  }
  stop_children(self, std::move(to_stop), [self, id, to_restart]() mutable {
    // Temporary siblings that were stopped are not restarted: OTP forgets them.
    auto& cs = self->state.children;
    for (auto i = cs.begin(); i != cs.end();) {
      auto next = std::next(i);
      if (i->spec.restart == restart_policy::temporary && i->spec.id != id && !i->handle)
        remove_child(self, i);
      i = next;
    }
    std::erase_if(to_restart, [self](const std::string& x) { return find(self, x) == nullptr; });
    schedule_restart(self, id, std::move(to_restart));
  });
}

void on_child_exit(sup_actor* self, child_entry& c, const caf::error& reason) {
  auto& st = self->state;
  auto id = c.spec.id;
  clear_handle(self, c);
  emit(self, supervisor_event_kind::exited, id, render(self, reason), c.restarts);
  if (c.status == child_status::stopping) {
    c.status = child_status::down;
    if (!st.stop_queue.empty() && st.stop_queue.front() == id) {
      st.stop_queue.pop_front();
      stop_next(self);
    }
    return;
  }
  c.status = child_status::down;
  if (st.shutting_down)
    return;
  fail(self, id, reason);
}

caf::behavior supervisor_fn(sup_actor* self, supervisor_config cfg) {
  auto& st = self->state;
  st.sup_name = std::move(cfg.name);
  st.flags = cfg.flags;
  st.log = log::get("supervisor");
  // Children are monitored, not linked: a child that receives an exit message unlinks from
  // its sender, so only a monitor reliably reports every exit.
  self->set_down_handler([self](caf::down_msg& msg) {
    if (auto* c = find(self, msg.source))
      on_child_exit(self, *c, msg.reason);
  });
  // An exit message comes from our parent (or whoever holds our handle): stop in order.
  self->set_exit_handler([self](caf::exit_msg& msg) { shutdown(self, msg.reason); });
  for (auto& spec : cfg.children) {
    TROUPE_CHECK(find(self, spec.id) == nullptr, "supervisor: duplicate child id " + spec.id);
    auto it = add_child(self, std::move(spec));
    auto& c = *it;
    if (!start(self, it)) {
      auto reason = make_error(errc::child_start_failed, c.spec.id);
      st.log->error("{}: child {} failed to start", st.sup_name, c.spec.id);
      remove_child(self, it);
      st.shutting_down = true;
      stop_children(self, running_children(self), [self, reason] { self->quit(reason); });
      return {};
    }
    emit(self, supervisor_event_kind::started, c.spec.id, "", 0);
  }
  return {
    [self](start_child_atom, child_spec& spec) -> caf::result<caf::actor> {
      auto& st = self->state;
      if (st.shutting_down)
        return make_error(errc::invalid_argument, st.sup_name + " is shutting down");
      if (find(self, spec.id) != nullptr)
        return make_error(errc::duplicate_child, spec.id);
      auto it = add_child(self, std::move(spec));
      auto& c = *it;
      if (!start(self, it)) {
        auto id = c.spec.id;
        remove_child(self, it);
        return make_error(errc::child_start_failed, id);
      }
      emit(self, supervisor_event_kind::started, c.spec.id, "", 0);
      return c.handle;
    },
    [self](stop_child_atom, const std::string& id) -> caf::result<caf::unit_t> {
      auto& st = self->state;
      if (find(self, id) == nullptr)
        return make_error(errc::unknown_child, id);
      auto rp = self->make_response_promise();
      auto go = [self, id, rp]() mutable {
        auto* c = find(self, id);
        if (c == nullptr) {
          rp.deliver(make_error(errc::unknown_child, id));
          return;
        }
        // Removed first, so that its exit is not taken for a failure.
        c->spec.restart = restart_policy::temporary;
        stop_children(self, {id}, [self, id, rp]() mutable {
          if (auto i = self->state.by_id.find(id); i != self->state.by_id.end())
            remove_child(self, i->second);
          rp.deliver(caf::unit);
        });
      };
      if (st.busy)
        st.deferred.push_back(std::move(go));
      else
        go();
      return rp;
    },
    [self](which_children_atom) {
      std::vector<child_info> rows;
      for (auto& c : self->state.children)
        rows.push_back(child_info{c.spec.id, c.handle, c.restarts});
      return rows;
    },
    [self](subscribe_atom, caf::actor& subscriber) {
      self->state.subscribers.push_back(std::move(subscriber));
      return caf::unit;
    },
    [self](restart_timer_atom, std::uint64_t token) {
      auto& st = self->state;
      auto i = st.pending_restarts.find(token);
      if (i == st.pending_restarts.end())
        return;
      auto ids = std::move(i->second);
      st.pending_restarts.erase(i);
      auto go = [self, ids] { restart_now(self, ids); };
      if (st.busy)
        st.deferred.push_back(std::move(go));
      else
        go();
    },
    [self](kill_timer_atom, const std::string& id, std::uint64_t token) {
      auto* c = find(self, id);
      if (c != nullptr && c->status == child_status::stopping && c->stop_token == token
          && c->handle) {
        self->state.log->info("{}: {} did not stop within its grace; killing",
                              self->state.sup_name, id);
        self->send_exit(c->handle, caf::exit_reason::kill);
      }
    },
  };
}

} // namespace

caf::actor spawn_supervisor(caf::actor_system& sys, supervisor_config cfg) {
  return sys.spawn(supervisor_fn, std::move(cfg));
}

child_spec supervisor_child(supervisor_config cfg) {
  child_spec spec;
  spec.id = cfg.name;
  spec.start = [cfg](caf::local_actor* self) { return self->spawn(supervisor_fn, cfg); };
  spec.restart = restart_policy::permanent;
  spec.shutdown = infinite_grace;
  return spec;
}

} // namespace troupe::runtime

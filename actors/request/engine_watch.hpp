// engine_watch: many request actors watching the same engine actor, at O(log n) each.
//
// A request watches the engine its current job waits on, so that the engine's death reaches
// it as a down message (CAF 0.17 does not fail a request whose receiver died holding it).
// With `monitor`, every watch is an entry in the engine's own attachable list: CAF adds it at
// the head and a `demonitor` scans from there, and since jobs end roughly oldest first, each
// demonitor walks the whole queue — under overload (thousands of requests queued per
// instance) that scan was 17 % of the simulator's time (docs/benchmarks.md). Here one
// functor attached to each engine serves all its watchers, kept in an ordered map: a watch
// and its end cost a map insert and erase, and the engine's death sends each live watcher
// the `down_msg{engine, reason}` a monitor would have sent, in watcher id order.
//
// Thread-safe (one mutex per registry, held only for map operations), so the request actors
// of the real world, which run on several scheduler threads, share one; shared by the
// request actors of one graph through request_services.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/error.hpp>

#include <map>
#include <memory>
#include <mutex>

namespace troupe::actors {

class engine_watch : public std::enable_shared_from_this<engine_watch> {
public:
  /// One actor's watch of one engine; ends when reset, reassigned or destroyed (with the
  /// actor's state, so a request that quits while watching leaves nothing behind).
  class ticket {
  public:
    ticket() = default;
    ticket(ticket&& other) noexcept;
    ticket& operator=(ticket&& other) noexcept;
    ticket(const ticket&) = delete;
    ticket& operator=(const ticket&) = delete;
    ~ticket() { reset(); }

    /// The watched engine (invalid when none).
    const caf::actor_addr& engine() const { return engine_; }
    explicit operator bool() const { return static_cast<bool>(engine_); }
    /// Stops watching (no down message for this watch comes after this).
    void reset();

  private:
    friend class engine_watch;
    std::weak_ptr<engine_watch> registry_;
    caf::actor_addr engine_;
    caf::actor_id watcher_ = 0;
  };

  /// `watcher` watches `engine` until the ticket ends; when the engine terminates first
  /// (or has already terminated), `watcher` receives `caf::down_msg{engine, reason}`.
  ticket watch(const caf::actor_addr& engine, const caf::actor_addr& watcher);

  /// Watches held now, over all engines (for tests).
  std::size_t size() const;

private:
  struct entry {
    std::map<caf::actor_id, caf::actor_addr> watchers;
  };
  void unwatch(const caf::actor_addr& engine, caf::actor_id watcher);
  void engine_down(const caf::actor_addr& engine, const caf::error& reason,
                   caf::execution_unit* host);

  mutable std::mutex mutex_;
  std::map<caf::actor_addr, entry> engines_;
};

using engine_watch_ptr = std::shared_ptr<engine_watch>;

} // namespace troupe::actors

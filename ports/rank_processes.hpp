// The processes of an EP group's ranks beyond those its device runs as threads
// (cpu_device_params::ranks_per_process): each a `troupe ep-rank` started by the device, joined
// to it by a socketpair (its end as the child's fd 3), serving its ranks until the group closes
// the socket (kernels/ep_process.hpp).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/ep_process.hpp"
#include "kernels/result.hpp"

namespace troupe::ports {

/// What a rank process loads: the device's model, its options, and the group's size.
struct ep_rank_options {
  std::filesystem::path model_dir;
  std::string engram_map;
  int threads = 2;
  bool batch_invariant = true;
  /// The group's ranks (its placement: kernels::place_experts of the model's routed experts).
  std::uint32_t group = 1;
  /// The ranks this process serves, ascending, above 0.
  std::vector<std::int32_t> ranks;
};

/// The rank processes of one group: started together, reaped when this goes (after the
/// group that owns their sockets has closed them: they then exit by themselves; one that has
/// not within two seconds is killed).
class rank_processes {
 public:
  /// Told, from the watcher's thread, the ranks of the processes a signal ended and how.
  using killed_fn = std::function<void(std::uint32_t ranks, const std::string& why)>;

  rank_processes();
  rank_processes(rank_processes&&) noexcept;
  rank_processes& operator=(rank_processes&&) noexcept;
  ~rank_processes();
  /// Starts `program ep-rank ...` for ranks per_process .. group-1 of `o`'s group, per_process
  /// ranks each (the last may hold fewer); `o.ranks` is ignored. Returns the peers to open the
  /// group with (kernels::open_ep_group), whose sockets the group then owns. Errors: the
  /// program could not be started (nothing is left running).
  kernels::result<std::vector<kernels::ep_peer>> start(const std::filesystem::path& program,
                                                       ep_rank_options o,
                                                       std::uint32_t per_process);
  /// Ranks held by the processes that a signal ended (killed, crashed: not those that exited
  /// by themselves, after the group closed their sockets or could not load) and that neither
  /// this nor the watcher counted before; while none was ever found it waits up to `wait` for
  /// one (a group whose peer's socket ended finds the process gone a moment later).
  std::uint32_t killed_ranks(std::chrono::milliseconds wait);
  /// Watches the processes from a thread of its own (every 100 ms) until one is found ended
  /// by a signal: then calls `on_killed` once with the ranks of those found (counted: a later
  /// killed_ranks does not count them again), so that an idle group learns it lost a rank.
  void watch(killed_fn on_killed);
  bool empty() const;

 private:
  struct children;
  void reap_all();
  std::unique_ptr<children> children_;
  std::thread watcher_;
};

/// The `troupe ep-rank` child of process `parent` that serves `rank` of its group, as its
/// command line says (read from /proc); none: no such child runs (it died, or the group that
/// would start it has not yet).
std::optional<pid_t> find_rank_process(pid_t parent, std::uint32_t rank);

/// The `troupe ep-rank --fd N` process: serves `o.ranks` of the group at the other end of `fd`
/// (kernels::serve_ep_peer) with the model's Engram map set. Returns its exit code: 0 once the
/// group closed the socket, 1 when its ranks could not load (the group is told why).
int run_ep_rank(int fd, const ep_rank_options& o);

}  // namespace troupe::ports

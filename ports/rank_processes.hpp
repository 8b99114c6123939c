// The processes of an EP group's ranks beyond those its device runs as threads
// (cpu_device_params::ranks_per_process): each a `troupe ep-rank` started by the device, joined
// to it by a socketpair (its end as the child's fd 3), serving its ranks until the group closes
// the socket (kernels/ep_process.hpp).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
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
  rank_processes() = default;
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
  /// by themselves, after the group closed their sockets or could not load); for a group whose
  /// peer died it waits up to `wait` for one to be found.
  std::uint32_t killed_ranks(std::chrono::milliseconds wait);

  bool empty() const { return children_.empty(); }

 private:
  struct child {
    pid_t pid = -1;
    std::uint32_t ranks = 0;
    bool exited = false;
    bool killed = false;
  };
  void reap_all();
  std::vector<child> children_;
};

/// The `troupe ep-rank --fd N` process: serves `o.ranks` of the group at the other end of `fd`
/// (kernels::serve_ep_peer) with the model's Engram map set. Returns its exit code: 0 once the
/// group closed the socket, 1 when its ranks could not load (the group is told why).
int run_ep_rank(int fd, const ep_rank_options& o);

}  // namespace troupe::ports

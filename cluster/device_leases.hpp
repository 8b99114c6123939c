// device_leases: which GPU of this host a device takes, so that two devices do not share one.
//
// A CUDA device of `troupe serve` or of a `troupe launch` instance process picks its GPU when
// it opens. The preferred one is its instance's index modulo the GPUs (prefill i: i; decode i:
// the prefill instances + i), but the autoscaler's instance ids only grow, several processes
// of one host choose independently, and two servers may run on one machine. So the choice is a
// lease: an exclusive `flock` on a lock file per GPU (named by its PCI bus id, which
// CUDA_VISIBLE_DEVICES does not renumber), in a directory every process of the host shares.
// The kernel drops the lock when its holder closes it or dies, however it dies: a crashed
// process's GPU is free for its restart at once, and nothing needs cleaning up.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace troupe::cluster {

/// The directory of the lock files: $TROUPE_LOCK_DIR, else /tmp.
std::filesystem::path device_lock_dir();

/// A device held: the lock is released when the last copy of the lease is dropped.
struct device_lease;

struct leased_device {
  /// The device's index in the keys given.
  std::size_t index = 0;
  /// The lease; null when every device was held and `index` is the preferred one, shared.
  std::shared_ptr<const device_lease> lease;
};

/// Takes the first device, from `preferred` on (cyclically), whose lock in `dir` no one
/// holds; `keys` name the host's devices (one each, e.g. PCI bus ids; characters other than
/// letters and digits become '_' in the file name). When every one is held, or a lock file
/// cannot be opened, the preferred device without a lease. Requires keys non-empty and
/// preferred < keys.size().
leased_device lease_device(const std::vector<std::string>& keys, std::size_t preferred,
                           const std::filesystem::path& dir = device_lock_dir());

} // namespace troupe::cluster

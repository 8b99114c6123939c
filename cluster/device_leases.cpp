#include "cluster/device_leases.hpp"

#include <cctype>
#include <cstdlib>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace troupe::cluster {

struct device_lease {
  int fd = -1;
  ~device_lease() {
    if (fd >= 0)
      ::close(fd);  // drops the flock
  }
};

std::filesystem::path device_lock_dir() {
  if (const char* dir = std::getenv("TROUPE_LOCK_DIR"); dir != nullptr && *dir != '\0')
    return dir;
  return "/tmp";
}

namespace {

std::filesystem::path lock_file(const std::filesystem::path& dir, const std::string& key) {
  std::string name = "troupe-gpu-";
  for (unsigned char c : key)
    name += std::isalnum(c) ? static_cast<char>(c) : '_';
  return dir / (name + ".lock");
}

/// The lease of the lock file of `key`, or null when another holds it (or it cannot be opened).
std::shared_ptr<const device_lease> try_lease(const std::filesystem::path& dir,
                                              const std::string& key) {
  // Readable by every user of the host, so that their processes lock the same file.
  const int fd = ::open(lock_file(dir, key).c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return nullptr;
  auto lease = std::make_shared<device_lease>();
  lease->fd = fd;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0)
    return nullptr;  // held elsewhere (the lease closes the file)
  return lease;
}

} // namespace

leased_device lease_device(const std::vector<std::string>& keys, std::size_t preferred,
                           const std::filesystem::path& dir) {
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const auto i = (preferred + k) % keys.size();
    if (auto lease = try_lease(dir, keys[i]))
      return {i, std::move(lease)};
  }
  return {preferred, nullptr};
}

} // namespace troupe::cluster

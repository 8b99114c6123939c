// Tests of cluster/device_leases: the GPU a device takes, held by a lock file per GPU, freed
// when the lease is dropped or its process dies.
#include "cluster/device_leases.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace troupe::cluster;
namespace fs = std::filesystem;

namespace {

struct lock_dir {
  fs::path path;
  lock_dir() {
    std::string tmpl = (fs::temp_directory_path() / "troupe-leases-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~lock_dir() { fs::remove_all(path); }
};

const std::vector<std::string> gpus{"0000:1B:00.0", "0000:3B:00.0", "0000:5D:00.0"};

} // namespace

TEST_CASE("devices take the first free GPU from their preferred one on") {
  lock_dir dir;
  auto a = lease_device(gpus, 0, dir.path);
  CHECK(a.index == 0);
  REQUIRE(a.lease);
  CHECK(fs::exists(dir.path / "troupe-gpu-0000_1B_00_0.lock"));
  // Preferring a held GPU: the next free one, cyclically.
  auto b = lease_device(gpus, 0, dir.path);
  CHECK(b.index == 1);
  auto c = lease_device(gpus, 2, dir.path);
  CHECK(c.index == 2);
  // Every GPU held: the preferred one, shared, without a lease.
  auto d = lease_device(gpus, 1, dir.path);
  CHECK(d.index == 1);
  CHECK_FALSE(d.lease);
  // A lease dropped (its device closed) frees its GPU; a copy keeps it.
  auto kept = b.lease;
  b = {};
  CHECK(lease_device(gpus, 1, dir.path).index == 1);  // the lease is kept: still shared
  CHECK_FALSE(lease_device(gpus, 1, dir.path).lease);
  kept.reset();
  auto e = lease_device(gpus, 0, dir.path);
  CHECK(e.index == 1);
  CHECK(e.lease);
}

TEST_CASE("a GPU held by another process is skipped, and free again once that process dies") {
  lock_dir dir;
  int ready[2], go[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(go) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto held = lease_device(gpus, 0, dir.path);
    char c = held.index == 0 && held.lease ? 'y' : 'n';
    (void) !::write(ready[1], &c, 1);
    (void) !::read(go[0], &c, 1);  // until the parent has looked
    ::_exit(0);                     // dies holding it: the kernel releases the lock
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  REQUIRE(c == 'y');
  auto other = lease_device(gpus, 0, dir.path);
  CHECK(other.index == 1);
  other = {};
  (void) !::write(go[1], &c, 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  auto after = lease_device(gpus, 0, dir.path);
  CHECK(after.index == 0);
  CHECK(after.lease);
  for (int fd : {ready[0], ready[1], go[0], go[1]})
    ::close(fd);
}

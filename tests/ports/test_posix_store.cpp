// The POSIX store beyond the port's contract: its file layout, integrity checks, crash
// safety, restart and eviction on disk. The contract itself is tested against both stores
// in test_store_contract.cpp.
#include "ports/posix_store.hpp"
#include "runtime/errors.hpp"
#include "store_drivers.hpp"

#include <doctest/doctest.h>

#include <xxhash.h>

#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>

using namespace troupe;
using namespace troupe::runtime;
using namespace std::chrono_literals;
using test::bytes;
using test::key;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t header = ports::posix_store_header_bytes;

/// A POSIX store driver with helpers to reach into its directory.
struct posix_fixture : test::posix_store_driver {
  explicit posix_fixture(std::uint64_t capacity = 10'000'000) : posix_store_driver(capacity) {}

  store_stats put(store_key k, std::vector<std::uint8_t> payload, duration ttl = duration{0}) {
    auto size = payload.size();
    auto r = call<store_stats>(store_put{k, size, std::move(payload), ttl});
    REQUIRE(r);
    return *r;
  }

  caf::expected<store_object> get(store_key k) { return call<store_object>(store_get{k}); }

  bool has(store_key k) {
    auto r = call<bool>(store_has{k});
    REQUIRE(r);
    return *r;
  }

  std::vector<store_entry> list() {
    auto r = call<std::vector<store_entry>>(store_list{});
    REQUIRE(r);
    return *r;
  }

  store_stats stats() {
    auto r = call<store_stats>(store_stats_atom::value);
    REQUIRE(r);
    return *r;
  }

  /// Stops the store and starts another one on the same directory and clock.
  void restart(std::uint64_t capacity = 10'000'000) {
    test::stop(self, store);
    store = spawn(capacity);
  }

  /// `<dir>/<2 hex>/<32 hex>.blk`
  fs::path file_of(store_key k) const {
    auto hex = to_string(k);
    return dir.path() / hex.substr(0, 2) / (hex + ".blk");
  }

  /// Every regular file under the store's directory.
  std::vector<fs::path> files() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::recursive_directory_iterator(dir.path()))
      if (e.is_regular_file())
        out.push_back(e.path());
    return out;
  }
};

std::vector<std::uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::vector<std::uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::uint64_t u64_at(const std::vector<std::uint8_t>& b, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | b[at + static_cast<std::size_t>(i)];
  return v;
}

/// Checks that a get of `k` fails with store_corrupt, counted, and that the block is gone.
void check_refused_as_corrupt(posix_fixture& f, store_key k) {
  auto got = f.get(k);
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), errc::store_corrupt));
  CHECK_FALSE(fs::exists(f.file_of(k)));
  CHECK_FALSE(f.has(k));
  auto again = f.get(k);
  REQUIRE_FALSE(again);
  CHECK(is(again.error(), errc::not_found));
  auto s = f.stats();
  CHECK(s.corrupt == 1);
  CHECK(s.objects == 0);
  CHECK(s.used == 0);
}

} // namespace

TEST_CASE("a put writes <dir>/<2 hex>/<32 hex>.blk: the 64-byte header, then the payload") {
  posix_fixture f;
  auto k = store_key{0xab01020304050607ULL, 0x08090a0b0c0d0e0fULL};
  auto payload = bytes(1000, 7);
  f.put(k, payload, 10s);
  auto path = f.dir.path() / "ab" / "ab0102030405060708090a0b0c0d0e0f.blk";
  CHECK(f.file_of(k) == path);
  REQUIRE(fs::exists(path));
  auto b = read_file(path);
  REQUIRE(b.size() == header + 1000);
  CHECK(std::string(b.begin(), b.begin() + 4) == "TRBK");
  CHECK((b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24) == 1); // format version
  CHECK(u64_at(b, 8) == k.hi);
  CHECK(u64_at(b, 16) == k.lo);
  CHECK(u64_at(b, 24) == 1000);
  auto expiry = f.clock.now() + 10s;
  CHECK(u64_at(b, 32) == static_cast<std::uint64_t>(
                           std::chrono::duration_cast<std::chrono::nanoseconds>(
                             expiry.time_since_epoch())
                             .count()));
  CHECK(u64_at(b, 40) == XXH3_64bits(payload.data(), payload.size()));
  CHECK(u64_at(b, 48) == 0);
  CHECK(u64_at(b, 56) == XXH3_64bits(b.data(), 56));
  CHECK(std::vector<std::uint8_t>(b.begin() + header, b.end()) == payload);
  // Nothing else: the temporary file was renamed.
  CHECK(f.files() == std::vector<fs::path>{path});
}

TEST_CASE("an object that never expires has expiry 0 in its header") {
  posix_fixture f;
  f.put(key(1), bytes(10, 1));
  CHECK(u64_at(read_file(f.file_of(key(1))), 32) == 0);
}

// -- integrity ------------------------------------------------------------------------------

TEST_CASE("a flipped payload byte makes get fail with store_corrupt and the block is gone") {
  posix_fixture f;
  f.put(key(1), bytes(4096, 1));
  auto b = read_file(f.file_of(key(1)));
  b[header + 1234] ^= 0x10;
  write_file(f.file_of(key(1)), b);
  check_refused_as_corrupt(f, key(1));
}

TEST_CASE("a flipped header byte makes get fail with store_corrupt and the block is gone") {
  posix_fixture f;
  f.put(key(1), bytes(4096, 1));
  auto b = read_file(f.file_of(key(1)));
  b[25] ^= 0x01; // the payload size
  write_file(f.file_of(key(1)), b);
  check_refused_as_corrupt(f, key(1));
}

TEST_CASE("a truncated block file makes get fail with store_corrupt and the block is gone") {
  posix_fixture f;
  f.put(key(1), bytes(4096, 1));
  fs::resize_file(f.file_of(key(1)), header + 4000);
  check_refused_as_corrupt(f, key(1));
}

TEST_CASE("a block file truncated inside its header is refused as store_corrupt") {
  posix_fixture f;
  f.put(key(1), bytes(4096, 1));
  fs::resize_file(f.file_of(key(1)), 20);
  check_refused_as_corrupt(f, key(1));
}

TEST_CASE("a block file holding another key's block is refused as store_corrupt") {
  posix_fixture f;
  f.put(key(1), bytes(100, 1));
  f.put(key(2), bytes(100, 2));
  fs::copy_file(f.file_of(key(2)), f.file_of(key(1)), fs::copy_options::overwrite_existing);
  auto got = f.get(key(1));
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), errc::store_corrupt));
  CHECK_FALSE(fs::exists(f.file_of(key(1))));
  CHECK(f.get(key(2))); // the other block is untouched
  CHECK(f.stats().corrupt == 1);
}

TEST_CASE("a block file removed behind the store's back is a miss, not an error") {
  posix_fixture f;
  f.put(key(1), bytes(100, 1));
  fs::remove(f.file_of(key(1)));
  auto got = f.get(key(1));
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), errc::not_found));
  auto s = f.stats();
  CHECK(s.objects == 0);
  CHECK(s.misses == 1);
  CHECK(s.corrupt == 0);
}

// -- crash safety and restart ---------------------------------------------------------------

TEST_CASE("a leftover temporary file from a crash is deleted at start and never listed") {
  posix_fixture f;
  f.put(key(1), bytes(100, 1));
  test::stop(f.self, f.store);
  auto sub = f.file_of(key(2)).parent_path();
  fs::create_directories(sub);
  auto temp = sub / (to_string(key(2)) + ".12345-1.tmp");
  write_file(temp, bytes(500, 9)); // a torn write: no valid header
  f.store = f.spawn(10'000'000);
  auto listed = f.list(); // answered after the start-up scan
  CHECK_FALSE(fs::exists(temp));
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].key == key(1));
  CHECK_FALSE(f.has(key(2)));
  CHECK(f.stats().corrupt == 0);
}

TEST_CASE(
  "a crash after the temporary file was written and before the rename leaves the old object") {
  posix_fixture f;
  // The bytes a put of the new version writes, then the old version in place.
  f.put(key(1), bytes(2000, 2));
  auto new_version = read_file(f.file_of(key(1)));
  f.put(key(1), bytes(1000, 1));
  test::stop(f.self, f.store);
  // The crash: the new version's temporary file is complete, the rename never happened.
  auto temp = f.file_of(key(1)).parent_path() / (to_string(key(1)) + ".999-7.tmp");
  write_file(temp, new_version);
  f.store = f.spawn(10'000'000);
  auto got = f.get(key(1));
  REQUIRE(got);
  CHECK(got->payload == bytes(1000, 1));
  CHECK_FALSE(fs::exists(temp));
  CHECK(f.files().size() == 1);
}

TEST_CASE(
  "a store spawned on the directory of a stopped store finds every block with identical payloads") {
  posix_fixture f;
  std::vector<std::vector<std::uint8_t>> payloads;
  for (std::uint64_t i = 0; i < 50; ++i) {
    payloads.push_back(bytes(100 + i * 997, static_cast<std::uint8_t>(i)));
    f.put(key(i), payloads.back(), i % 2 == 0 ? duration{0} : duration{std::chrono::hours(i)});
  }
  auto before = f.list();
  auto stats_before = f.stats();
  f.restart();
  auto s = f.stats();
  CHECK(s.objects == 50);
  CHECK(s.used == stats_before.used);
  auto after = f.list();
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].key == before[i].key);
    CHECK(after[i].size == before[i].size);
    // The expiry came back from the header: the same wall-clock instant, so the actor-clock
    // instants differ only by the actor time between the two lists.
    if (before[i].expires_at == store_never_expires)
      CHECK(after[i].expires_at == store_never_expires);
    else
      CHECK(after[i].expires_at - before[i].expires_at < 60s);
  }
  for (std::uint64_t i = 0; i < 50; ++i) {
    auto got = f.get(key(i));
    REQUIRE(got);
    CHECK(got->payload == payloads[i]);
  }
}

TEST_CASE("a restarted store drops blocks whose ttl passed while it was down") {
  posix_fixture f;
  f.put(key(1), bytes(100, 1), 10s);
  f.put(key(2), bytes(100, 2), 1h);
  test::stop(f.self, f.store);
  f.advance(11s);
  f.store = f.spawn(10'000'000);
  auto s = f.stats();
  CHECK(s.objects == 1);
  CHECK(s.expired == 1);
  CHECK_FALSE(fs::exists(f.file_of(key(1))));
  CHECK_FALSE(f.has(key(1)));
  CHECK(f.has(key(2)));
}

TEST_CASE("a restarted store deletes malformed block files and counts them as corrupt") {
  posix_fixture f;
  f.put(key(1), bytes(100, 1));
  f.put(key(2), bytes(100, 2));
  test::stop(f.self, f.store);
  auto b = read_file(f.file_of(key(2)));
  b[3] ^= 0xff; // the magic
  write_file(f.file_of(key(2)), b);
  f.store = f.spawn(10'000'000);
  auto s = f.stats();
  CHECK(s.objects == 1);
  CHECK(s.corrupt == 1);
  CHECK_FALSE(fs::exists(f.file_of(key(2))));
  CHECK(f.get(key(1)));
}

TEST_CASE("a restarted store over its capacity evicts the least recently modified blocks") {
  posix_fixture f;
  for (std::uint64_t i = 0; i < 5; ++i)
    f.put(key(i), bytes(1000, static_cast<std::uint8_t>(i)));
  test::stop(f.self, f.store);
  // Block i was last modified i seconds before block 0: block 4 is the oldest, whatever
  // order the puts' own timestamps had.
  for (std::uint64_t i = 0; i < 5; ++i) {
    timespec times[2];
    times[0].tv_sec = times[1].tv_sec = static_cast<time_t>(1'700'000'000 - i);
    times[0].tv_nsec = times[1].tv_nsec = 0;
    REQUIRE(::utimensat(AT_FDCWD, f.file_of(key(i)).c_str(), times, 0) == 0);
  }
  f.store = f.spawn(3 * (header + 1000));
  auto s = f.stats();
  CHECK(s.objects == 3);
  CHECK(s.evicted == 2);
  CHECK(s.used <= s.capacity);
  CHECK_FALSE(f.has(key(4)));
  CHECK_FALSE(f.has(key(3)));
  CHECK_FALSE(fs::exists(f.file_of(key(4))));
  CHECK_FALSE(fs::exists(f.file_of(key(3))));
  for (std::uint64_t i = 0; i < 3; ++i)
    CHECK(f.has(key(i)));
}

// -- eviction on disk -----------------------------------------------------------------------

TEST_CASE("an evicted block's file is deleted and the others stay") {
  posix_fixture f(3 * (header + 1000));
  for (std::uint64_t i = 0; i < 3; ++i)
    f.put(key(i), bytes(1000, static_cast<std::uint8_t>(i)));
  REQUIRE(f.get(key(0)));
  f.put(key(3), bytes(1000, 3)); // evicts key 1, the least recently used
  CHECK_FALSE(fs::exists(f.file_of(key(1))));
  for (std::uint64_t i : {0, 2, 3})
    CHECK(fs::exists(f.file_of(key(i))));
  CHECK(f.files().size() == 3);
}

TEST_CASE("1,000 puts of 114,044-byte blocks stay within the capacity, in the stats and on disk") {
  constexpr std::uint64_t block = 114'044;
  constexpr std::uint64_t capacity = 100 * (header + block);
  posix_fixture f(capacity);
  std::uint64_t over = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    auto s = f.put(key(i), bytes(block, static_cast<std::uint8_t>(i)));
    if (s.used > capacity)
      ++over;
  }
  CHECK(over == 0);
  auto s = f.stats();
  CHECK(s.objects == 100);
  CHECK(s.evicted == 900);
  CHECK(s.used == capacity);
  auto files = f.files();
  CHECK(files.size() == 100);
  std::uint64_t on_disk = 0;
  for (const auto& p : files)
    on_disk += fs::file_size(p);
  CHECK(on_disk == s.used);
  for (std::uint64_t i = 900; i < 1000; ++i) // the last 100 puts are the ones kept
    CHECK(f.has(key(i)));
}

// -- start-up failure -----------------------------------------------------------------------

TEST_CASE("a store on a path that is not a directory exits with unavailable") {
  test::temp_dir dir;
  auto file = dir.path() / "not-a-directory";
  write_file(file, bytes(10, 0));
  runtime::world world{runtime::world_options{runtime::world_mode::real, 1, 2, false, nullptr}};
  caf::scoped_actor self{world.system()};
  auto store = ports::spawn_posix_store(world.system(), {file, 1000, {}});
  self->monitor(store);
  caf::error reason;
  self->receive([&](const caf::down_msg& m) { reason = m.reason; });
  CHECK(is(reason, errc::unavailable));
}

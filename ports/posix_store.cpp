#include "ports/posix_store.hpp"
#include "ports/le_bytes.hpp"
#include "ports/store_metrics.hpp"

#include "runtime/errors.hpp"
#include "runtime/ports/store_index.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/result.hpp>
#include <caf/stateful_actor.hpp>

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bitset>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace troupe::ports {

namespace fs = std::filesystem;
using runtime::errc;
using runtime::make_error;
using runtime::store_index;
using runtime::store_key;
using runtime::store_stats;

namespace {

// -- the block file header --------------------------------------------------------------------
//
// 64 bytes, all integers little-endian:
//   0 magic "TRBK" | 4 version u32 | 8 key.hi u64 | 16 key.lo u64 | 24 payload size u64 |
//   32 expiry u64 (ns since the Unix epoch; 0 = never) | 40 XXH3-64 of the payload |
//   48 reserved u64 (0) | 56 XXH3-64 of bytes 0..55

constexpr std::array<std::uint8_t, 4> block_magic{'T', 'R', 'B', 'K'};
constexpr std::uint32_t block_version = 1;
constexpr std::size_t header_size = posix_store_header_bytes;
static_assert(header_size == 64);

struct block_header {
  store_key key;
  std::uint64_t size = 0;
  /// Nanoseconds since the Unix epoch; 0 = never expires.
  std::uint64_t expiry = 0;
  std::uint64_t payload_hash = 0;
};

using header_bytes = std::array<std::uint8_t, header_size>;

header_bytes encode(const block_header& h) {
  header_bytes b{};
  std::copy(block_magic.begin(), block_magic.end(), b.begin());
  put_u32(b.data() + 4, block_version);
  put_u64(b.data() + 8, h.key.hi);
  put_u64(b.data() + 16, h.key.lo);
  put_u64(b.data() + 24, h.size);
  put_u64(b.data() + 32, h.expiry);
  put_u64(b.data() + 40, h.payload_hash);
  put_u64(b.data() + 48, 0);
  put_u64(b.data() + 56, XXH3_64bits(b.data(), 56));
  return b;
}

/// The header in `b`, or nullopt when its magic, version, reserved field or checksum is off.
std::optional<block_header> decode(const header_bytes& b) {
  if (!std::equal(block_magic.begin(), block_magic.end(), b.begin()))
    return std::nullopt;
  if (get_u32(b.data() + 4) != block_version || get_u64(b.data() + 48) != 0)
    return std::nullopt;
  if (get_u64(b.data() + 56) != XXH3_64bits(b.data(), 56))
    return std::nullopt;
  block_header h;
  h.key = {get_u64(b.data() + 8), get_u64(b.data() + 16)};
  h.size = get_u64(b.data() + 24);
  h.expiry = get_u64(b.data() + 32);
  h.payload_hash = get_u64(b.data() + 40);
  return h;
}

// -- names ------------------------------------------------------------------------------------

std::optional<std::uint64_t> parse_hex64(std::string_view s) {
  if (s.size() != 16)
    return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0)
      return std::nullopt;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  return v;
}

/// The key named by a block file name `<32 hex>.blk`, or nullopt.
std::optional<store_key> key_of_file_name(std::string_view name) {
  constexpr std::string_view ext = ".blk";
  if (name.size() != 32 + ext.size() || name.substr(32) != ext)
    return std::nullopt;
  auto hi = parse_hex64(name.substr(0, 16));
  auto lo = parse_hex64(name.substr(16, 16));
  if (!hi || !lo)
    return std::nullopt;
  return store_key{*hi, *lo};
}

/// The fan-out byte of a key (its first byte: the first two hex digits of its name).
unsigned fanout_of(const store_key& k) {
  return static_cast<unsigned>(k.hi >> 56);
}

/// "00".."ff" for a fan-out byte.
std::string fanout_name(unsigned byte) {
  static constexpr char digits[] = "0123456789abcdef";
  return {digits[byte >> 4], digits[byte & 15]};
}

// -- POSIX helpers ----------------------------------------------------------------------------

struct fd_guard {
  int fd = -1;
  explicit fd_guard(int f) : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
  /// Closes now; the errno of a failed close, else 0.
  int close() {
    int rc = ::close(fd);
    fd = -1;
    return rc == 0 ? 0 : errno;
  }
};

/// Writes all of `n` bytes; 0 or the errno.
int write_all(int fd, const std::uint8_t* p, std::size_t n) {
  while (n > 0) {
    auto w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return errno;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

/// Reads up to `n` bytes at `offset`; the bytes read (fewer only at end of file), or -errno.
ssize_t read_at(int fd, std::uint8_t* p, std::size_t n, off_t offset) {
  std::size_t done = 0;
  while (done < n) {
    auto r = ::pread(fd, p + done, n - done, offset + static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (r == 0)
      break;
    done += static_cast<std::size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

/// fsyncs a directory (so that a rename or a new entry in it is durable); 0 or the errno.
int sync_directory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  fd_guard guard{fd};
  if (::fsync(fd) != 0)
    return errno;
  return guard.close();
}

/// The error of a failed file operation: store_full when the disk is full, else unavailable.
caf::error io_error(std::string_view what, const fs::path& path, int err) {
  auto code = err == ENOSPC || err == EDQUOT ? errc::store_full : errc::unavailable;
  return make_error(code, std::string(what) + " " + path.string() + ": " + std::strerror(err));
}

// -- reading a block file ---------------------------------------------------------------------

struct header_read {
  enum kind_t { ok, missing, corrupt, failed } kind = ok;
  block_header header;
  std::string why;   // corrupt: what is wrong
  int err = 0;       // failed: the errno
  timespec mtime{};  // ok: the file's modification time
};

/// Opens `path` and checks its header against `key` and the file size. On `ok`, `fd` holds
/// the open file (for the payload).
header_read read_header(const fs::path& path, const store_key& key, fd_guard& fd) {
  header_read out;
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd.fd < 0) {
    out.kind = errno == ENOENT ? header_read::missing : header_read::failed;
    out.err = errno;
    return out;
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) {
    out.kind = header_read::failed;
    out.err = errno;
    return out;
  }
  header_bytes b{};
  auto r = read_at(fd.fd, b.data(), b.size(), 0);
  if (r < 0) {
    out.kind = header_read::failed;
    out.err = static_cast<int>(-r);
    return out;
  }
  auto file_size = static_cast<std::uint64_t>(st.st_size);
  auto corrupt = [&](std::string why) {
    out.kind = header_read::corrupt;
    out.why = std::move(why);
    return out;
  };
  if (static_cast<std::size_t>(r) < header_size)
    return corrupt("truncated header (" + std::to_string(file_size) + " bytes)");
  auto h = decode(b);
  if (!h)
    return corrupt("bad header (magic, version or checksum)");
  if (h->key != key)
    return corrupt("header names key " + runtime::to_string(h->key));
  if (file_size - header_size != h->size)
    return corrupt("file holds " + std::to_string(file_size - header_size)
                   + " payload bytes, header says " + std::to_string(h->size));
  out.header = *h;
  out.mtime = st.st_mtim;
  return out;
}

// -- the actor --------------------------------------------------------------------------------

struct posix_store_state {
  posix_store_params params;
  store_index index{0};
  store_metrics metrics;
  /// Fan-out subdirectories known to exist.
  std::bitset<256> fanout_ready;
  /// Makes temporary file names unique within this process.
  std::uint64_t temp_counter = 0;
  static inline const char* name = "posix_store";

  /// Now on the store's wall clock, in nanoseconds since the Unix epoch.
  store_index::instant now() const {
    auto t = params.clock ? params.clock() : std::chrono::system_clock::now();
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }

  fs::path subdir(const store_key& k) const {
    return params.directory / fanout_name(fanout_of(k));
  }

  fs::path path_of(const store_key& k) const {
    return subdir(k) / (runtime::to_string(k) + ".blk");
  }

  /// Deletes the files of `keys` (already out of the index). Best effort: a file that stays
  /// behind is found by the next get or start-up scan.
  void remove_files(const std::vector<store_key>& keys) const {
    for (const auto& k : keys)
      ::unlink(path_of(k).c_str());
  }

  /// Removes the objects whose expiry has passed; every request starts with it.
  void sweep(store_index::instant now) { remove_files(index.sweep(now)); }

  /// Creates `k`'s fan-out subdirectory if needed (and makes its entry durable).
  caf::error ensure_subdir(const store_key& k) {
    auto byte = fanout_of(k);
    if (fanout_ready.test(byte))
      return {};
    auto dir = subdir(k);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      return io_error("mkdir", dir, errno);
    if (int err = sync_directory(params.directory))
      return io_error("fsync", params.directory, err);
    fanout_ready.set(byte);
    return {};
  }

  /// Writes the block file of `h` crash-safely (temporary file, fsync, rename, fsync of the
  /// directory). `renamed` tells whether the final name was replaced before a failure.
  caf::error write_block(const block_header& h, const std::vector<std::uint8_t>& payload,
                         bool& renamed) {
    renamed = false;
    if (auto err = ensure_subdir(h.key))
      return err;
    auto final_path = path_of(h.key);
    auto temp_path = subdir(h.key)
                     / (runtime::to_string(h.key) + "." + std::to_string(::getpid()) + "-"
                        + std::to_string(++temp_counter) + ".tmp");
    int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
      return io_error("create", temp_path, errno);
    fd_guard file{fd};
    auto fail = [&](std::string_view what, int err) {
      file.close();
      ::unlink(temp_path.c_str());
      return io_error(what, temp_path, err);
    };
    auto header = encode(h);
    if (int err = write_all(fd, header.data(), header.size()))
      return fail("write", err);
    if (int err = write_all(fd, payload.data(), payload.size()))
      return fail("write", err);
    if (::fsync(fd) != 0)
      return fail("fsync", errno);
    if (int err = file.close()) {
      ::unlink(temp_path.c_str());
      return io_error("close", temp_path, err);
    }
    if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
      int err = errno;
      ::unlink(temp_path.c_str());
      return io_error("rename", temp_path, err);
    }
    renamed = true;
    if (int err = sync_directory(subdir(h.key)))
      return io_error("fsync", subdir(h.key), err);
    return {};
  }

  /// Indexes the blocks already in the directory (see spawn_posix_store).
  caf::error open_directory() {
    const auto& dir = params.directory;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      return make_error(errc::unavailable, "create " + dir.string() + ": " + ec.message());
    if (!fs::is_directory(dir, ec))
      return make_error(errc::unavailable, dir.string() + " is not a directory");
    struct found {
      store_key key;
      store_index::entry entry;
      timespec mtime;
    };
    std::vector<found> blocks;
    auto now_ns = now();
    for (auto top = fs::directory_iterator(dir, ec); !ec && top != fs::directory_iterator();
         top.increment(ec)) {
      auto name = top->path().filename().string();
      auto byte = parse_hex64(std::string(14, '0') + name);
      std::error_code type_ec;
      if (name.size() != 2 || !byte || !top->is_directory(type_ec))
        continue; // not a fan-out directory: not ours
      fanout_ready.set(static_cast<std::size_t>(*byte));
      std::error_code sub_ec;
      for (auto it = fs::directory_iterator(top->path(), sub_ec);
           !sub_ec && it != fs::directory_iterator(); it.increment(sub_ec)) {
        auto file = it->path().filename().string();
        if (file.size() > 4 && file.ends_with(".tmp")) {
          ::unlink(it->path().c_str()); // a put interrupted by a crash
          continue;
        }
        auto key = key_of_file_name(file);
        if (!key)
          continue; // not a block file
        fd_guard fd{-1};
        header_read h;
        if (fanout_of(*key) == *byte)
          h = read_header(it->path(), *key, fd);
        else
          h.kind = header_read::corrupt; // in another key's fan-out directory
        if (h.kind == header_read::missing)
          continue;
        if (h.kind == header_read::failed)
          return io_error("read", it->path(), h.err);
        if (h.kind == header_read::corrupt) {
          ::unlink(it->path().c_str());
          index.count_corrupt();
          continue;
        }
        auto expiry = h.header.expiry == 0 ? store_index::never
                                           : static_cast<store_index::instant>(h.header.expiry);
        if (expiry <= now_ns) {
          ::unlink(it->path().c_str());
          index.count_expired();
          continue;
        }
        blocks.push_back({*key, {header_size + h.header.size, h.header.size, expiry}, h.mtime});
      }
      if (sub_ec)
        return make_error(errc::unavailable,
                          "read " + top->path().string() + ": " + sub_ec.message());
    }
    if (ec)
      return make_error(errc::unavailable, "read " + dir.string() + ": " + ec.message());
    // Least recently modified first, so the LRU order starts from the files' ages.
    std::sort(blocks.begin(), blocks.end(), [](const found& a, const found& b) {
      if (a.mtime.tv_sec != b.mtime.tv_sec)
        return a.mtime.tv_sec < b.mtime.tv_sec;
      if (a.mtime.tv_nsec != b.mtime.tv_nsec)
        return a.mtime.tv_nsec < b.mtime.tv_nsec;
      return a.key < b.key;
    });
    for (const auto& b : blocks) {
      auto victims = index.make_room(b.key, b.entry.bytes);
      if (!victims) { // larger than the whole capacity
        ::unlink(path_of(b.key).c_str());
        index.count_evicted();
        continue;
      }
      remove_files(*victims);
      index.insert(b.key, b.entry);
    }
    return {};
  }
};

using store_actor = caf::stateful_actor<posix_store_state>;

caf::result<store_stats> on_put(store_actor* self, runtime::store_put& put) {
  auto& st = self->state;
  if (put.payload.size() != put.size)
    return make_error(errc::invalid_argument,
                      "payload of " + std::to_string(put.payload.size())
                        + " bytes, declared size " + std::to_string(put.size));
  if (put.ttl < runtime::duration{0})
    return make_error(errc::invalid_argument, "negative ttl");
  auto now = st.now();
  st.sweep(now);
  auto capacity = st.index.capacity();
  auto victims = put.size <= capacity - std::min(capacity, std::uint64_t{header_size})
                   ? st.index.make_room(put.key, header_size + put.size)
                   : std::nullopt;
  if (!victims)
    return make_error(errc::store_full, std::to_string(put.size) + " bytes + header, capacity "
                                          + std::to_string(capacity));
  st.remove_files(*victims);
  auto ttl_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(put.ttl).count();
  auto expiry = std::max<store_index::instant>(store_index::expiry_after(now, ttl_ns), 1);
  block_header h{put.key, put.size,
                 expiry == store_index::never ? 0 : static_cast<std::uint64_t>(expiry),
                 XXH3_64bits(put.payload.data(), put.payload.size())};
  bool renamed = false;
  if (auto err = st.write_block(h, put.payload, renamed)) {
    if (renamed) { // the new file is in place but not durable: drop the key altogether
      ::unlink(st.path_of(put.key).c_str());
      st.index.erase(put.key);
    }
    return err;
  }
  st.index.insert(put.key, {header_size + put.size, put.size, expiry});
  return st.index.stats();
}

caf::result<runtime::store_object> on_get(store_actor* self, const runtime::store_get& get) {
  auto& st = self->state;
  auto now = st.now();
  st.sweep(now);
  auto not_found = [&] {
    st.index.count_miss();
    return make_error(errc::not_found, runtime::to_string(get.key));
  };
  if (st.index.find(get.key) == nullptr)
    return not_found();
  auto path = st.path_of(get.key);
  fd_guard fd{-1};
  auto h = read_header(path, get.key, fd);
  runtime::store_object obj{get.key, h.header.size, {}, h.header.payload_hash};
  if (h.kind == header_read::ok) {
    obj.payload.resize(h.header.size);
    auto r = read_at(fd.fd, obj.payload.data(), obj.payload.size(), header_size);
    if (r < 0) {
      h.kind = header_read::failed;
      h.err = static_cast<int>(-r);
    } else if (static_cast<std::uint64_t>(r) != h.header.size) {
      h.kind = header_read::corrupt;
      h.why = "truncated payload";
    } else if (XXH3_64bits(obj.payload.data(), obj.payload.size()) != h.header.payload_hash) {
      h.kind = header_read::corrupt;
      h.why = "payload checksum mismatch";
    }
  }
  switch (h.kind) {
    case header_read::missing: // removed behind the store's back
      st.index.erase(get.key);
      return not_found();
    case header_read::failed:
      return io_error("read", path, h.err);
    case header_read::corrupt:
      ::unlink(path.c_str());
      st.index.erase(get.key);
      st.index.count_corrupt();
      return make_error(errc::store_corrupt, path.string() + ": " + h.why);
    case header_read::ok:
      break;
  }
  if (h.header.expiry != 0 && static_cast<store_index::instant>(h.header.expiry) <= now) {
    ::unlink(path.c_str()); // the header is the truth; the index had a later expiry
    st.index.erase(get.key);
    st.index.count_expired();
    return not_found();
  }
  st.index.count_hit();
  st.index.touch(get.key);
  return obj;
}

caf::result<store_stats> on_delete(store_actor* self, const runtime::store_delete& del) {
  auto& st = self->state;
  st.sweep(st.now());
  if (st.index.find(del.key) == nullptr)
    return make_error(errc::not_found, runtime::to_string(del.key));
  auto path = st.path_of(del.key);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return io_error("unlink", path, errno);
  st.index.erase(del.key);
  return st.index.stats();
}

std::vector<runtime::store_entry> on_list(store_actor* self) {
  auto& st = self->state;
  auto now = st.now();
  st.sweep(now);
  auto actor_now = self->clock().now();
  // The latest instant a finite expiry may map to (one below "never").
  auto headroom = (runtime::store_never_expires - actor_now).count() - 1;
  std::vector<runtime::store_entry> out;
  out.reserve(st.index.objects());
  st.index.for_each([&](const store_key& k, const store_index::entry& e) {
    auto at = runtime::store_never_expires;
    if (e.expiry != store_index::never) {
      auto left = std::min<std::int64_t>(e.expiry - now, headroom);
      at = actor_now + std::chrono::nanoseconds{left};
    }
    out.push_back(runtime::store_entry{k, e.size, at});
  });
  return out;
}

caf::behavior posix_store_fn(store_actor* self, posix_store_params params) {
  self->state.index = store_index{params.capacity};
  self->state.params = std::move(params);
  if (auto err = self->state.open_directory()) {
    self->quit(std::move(err));
    return {};
  }
  auto& st = self->state;
  st.metrics = store_metrics::in(st.params.metrics, st.params.metrics_shard);
  st.metrics.publish(st.index.stats());
  // Every answer first publishes the stats it leaves behind.
  auto published = [self](auto&& result) {
    self->state.metrics.publish(self->state.index.stats());
    return std::forward<decltype(result)>(result);
  };
  return {
    [self, published](runtime::store_put& put) { return published(on_put(self, put)); },
    [self, published](const runtime::store_get& get) { return published(on_get(self, get)); },
    [self, published](const runtime::store_has& has) {
      auto& st = self->state;
      st.sweep(st.now());
      return published(st.index.find(has.key) != nullptr);
    },
    [self, published](const runtime::store_delete& del) {
      return published(on_delete(self, del));
    },
    [self, published](const runtime::store_list&) { return published(on_list(self)); },
    [self, published](runtime::store_stats_atom) {
      auto& st = self->state;
      st.sweep(st.now());
      return published(st.index.stats());
    },
  };
}

} // namespace

runtime::store_port spawn_posix_store(caf::actor_system& sys, posix_store_params params) {
  return caf::actor_cast<runtime::store_port>(
    sys.spawn<caf::detached>(posix_store_fn, std::move(params)));
}

} // namespace troupe::ports

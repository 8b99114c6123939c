// Drivers that run one store implementation each behind the same small synchronous API, so
// that the store contract suite is written once and run against both.
//
// A driver owns a world and one store of a given capacity, sends requests and waits for the
// replies (`call`), moves the store's clock forward (`advance`), and says what an object
// costs beyond its payload (`overhead`). The sim driver runs the store on CAF's deterministic
// scheduler and advances virtual time; the POSIX driver runs the real store (detached, its
// own thread) in a real world, in a fresh directory under the system temp dir that it
// removes, and advances the fake wall clock the store was given.
#pragma once

#include "../runtime/sim_fixture.hpp"

#include "ports/posix_store.hpp"
#include "runtime/ports/store.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

namespace troupe::test {

/// `n` bytes that differ with `seed` and position.
inline std::vector<std::uint8_t> bytes(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<std::uint8_t>(seed + i * 7 + (i >> 8));
  return out;
}

/// A key for test object `n`; keys of consecutive `n` land in different fan-out directories.
inline runtime::store_key key(std::uint64_t n) {
  return {0x9e3779b97f4a7c15ULL * (n + 1), n};
}

/// A fresh directory under the system temp dir, removed with everything in it.
class temp_dir {
public:
  temp_dir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path()
            / ("troupe-store-test-" + std::to_string(::getpid()) + "-"
               + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

private:
  std::filesystem::path path_;
};

/// A wall clock that moves only when told; safe to read from the store's thread.
class fake_clock {
public:
  /// Starts at 2026-01-01T00:00:00Z.
  fake_clock() : ns_(std::int64_t{1'767'225'600} * 1'000'000'000) {}

  std::chrono::system_clock::time_point now() const {
    return std::chrono::system_clock::time_point{
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::nanoseconds{ns_.load()})};
  }

  void advance(runtime::duration d) {
    ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

  /// The store parameter reading this clock (which must outlive the store).
  ports::wall_clock_fn fn() {
    return [this] { return now(); };
  }

private:
  std::atomic<std::int64_t> ns_;
};

/// The simulated store on the deterministic scheduler: 1 GB/s, 100 us latency.
struct sim_store_driver {
  static constexpr const char* name = "sim";
  static constexpr std::uint64_t overhead = 0;

  sim_fixture fx;
  runtime::store_port store;

  explicit sim_store_driver(std::uint64_t capacity)
    : store(runtime::spawn_sim_store(fx.sys, {capacity, std::chrono::microseconds(100), 1e9})) {
  }

  /// Sends `xs` and runs the world until the reply is there.
  template <class T, class... Ts>
  caf::expected<T> call(Ts... xs) {
    auto a = fx.ask<T>(store, std::move(xs)...);
    fx.run();
    if (a.value->has_value())
      return std::move(**a.value);
    return *a.error;
  }

  /// Moves virtual time forward by `d`.
  void advance(runtime::duration d) { fx.run_for(d); }

  /// Now on the actor clock.
  runtime::time_point now() const { return fx.world.now(); }
};

/// Sends `xs` to `dest` from `self` and waits for the reply.
template <class T, class... Ts>
caf::expected<T> request(caf::scoped_actor& self, const runtime::store_port& dest, Ts&&... xs) {
  std::optional<T> value;
  caf::error err;
  self->request(dest, caf::infinite, std::forward<Ts>(xs)...)
    .receive([&](T& x) { value = std::move(x); }, [&](caf::error& e) { err = std::move(e); });
  if (value)
    return std::move(*value);
  return err;
}

/// Stops `store` and waits until it has terminated (its files are closed).
inline void stop(caf::scoped_actor& self, const runtime::store_port& store) {
  self->monitor(store);
  self->send_exit(store, caf::exit_reason::user_shutdown);
  self->receive([](const caf::down_msg&) {});
}

/// The real store in a real world, in a fresh temp directory, on a fake wall clock.
struct posix_store_driver {
  static constexpr const char* name = "posix";
  static constexpr std::uint64_t overhead = ports::posix_store_header_bytes;

  temp_dir dir;
  fake_clock clock;
  runtime::world world{runtime::world_options{runtime::world_mode::real, 42, 2, false, nullptr}};
  caf::scoped_actor self{world.system()};
  runtime::store_port store;

  explicit posix_store_driver(std::uint64_t capacity) : store(spawn(capacity)) {}

  ~posix_store_driver() { stop(self, store); }

  /// Another store on this driver's directory and clock (stop the current one first).
  runtime::store_port spawn(std::uint64_t capacity) {
    return ports::spawn_posix_store(world.system(), {dir.path(), capacity, clock.fn()});
  }

  template <class T, class... Ts>
  caf::expected<T> call(Ts... xs) {
    return request<T>(self, store, std::move(xs)...);
  }

  /// Moves the store's wall clock forward by `d`.
  void advance(runtime::duration d) { clock.advance(d); }

  /// Now on the actor clock.
  runtime::time_point now() const { return world.now(); }
};

} // namespace troupe::test

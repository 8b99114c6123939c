// bench_supervisor: the cost of a troupe supervisor restart, beside a bare CAF peer.
//
// A one_for_one supervisor with 1,000 worker children runs on a simulated world. A driver
// actor crashes every child once, each after a seeded random virtual delay in [0, 1 s), so
// 1,000 restarts happen in virtual time; the wall time of the run and the driver's event
// count give restarts and events per second. The named peer, measured in the same run on a
// fresh world of its own, is a bare CAF actor that monitors its 1,000 children and respawns
// each one itself ("bare-monitor": no intensity, no strategies, no events), driven by the
// same driver with the same seed. The ratio is the supervisor's overhead per restart. A
// second pass does 10 rounds (10,000 restarts) for a steadier figure.
//
// Usage: bench_supervisor [children=1000] [rounds=10] [seed=42]
#include "runtime/supervisor.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace troupe::runtime;
using namespace std::chrono_literals;

namespace {

using crash_atom = caf::atom_constant<caf::atom("crash")>;
using round_atom = caf::atom_constant<caf::atom("round")>;

caf::behavior worker(caf::event_based_actor* self) {
  return {
    [self](crash_atom) { self->quit(caf::sec::runtime_error); },
  };
}

// -- the peer: a bare CAF actor that monitors and respawns its children ---------------------

struct bare_state {
  std::vector<caf::actor> children;
  std::vector<std::uint32_t> restarts;
  std::map<caf::actor_addr, std::size_t> index;
  static inline const char* name = "bare_monitor";
};

caf::behavior bare_monitor(caf::stateful_actor<bare_state>* self, std::size_t n) {
  auto start = [self](std::size_t i) {
    auto h = self->spawn(worker);
    self->monitor(h);
    self->state.index.emplace(h.address(), i);
    self->state.children[i] = std::move(h);
  };
  self->state.children.resize(n);
  self->state.restarts.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    start(i);
  self->set_down_handler([self, start](caf::down_msg& msg) {
    auto& st = self->state;
    auto it = st.index.find(msg.source);
    if (it == st.index.end())
      return;
    auto i = it->second;
    st.index.erase(it);
    ++st.restarts[i];
    start(i);
  });
  return {
    [self](which_children_atom) {
      std::vector<child_info> rows;
      auto& st = self->state;
      for (std::size_t i = 0; i < st.children.size(); ++i)
        rows.push_back(child_info{"", st.children[i], st.restarts[i]});
      return rows;
    },
  };
}

// -- the driver: crashes every child once per round, after a seeded random delay ------------

struct crasher_state {
  rng random{0};
  static inline const char* name = "crasher";
};

caf::behavior crasher(caf::stateful_actor<crasher_state>* self, caf::actor target, rng random) {
  self->state.random = random;
  return {
    [self, target](round_atom) {
      self->request(target, caf::infinite, which_children_atom::value)
        .then([self](const std::vector<child_info>& rows) {
          for (auto& row : rows)
            if (row.handle)
              self->delayed_send(row.handle,
                                 duration{self->state.random.below(1'000'000'000)},
                                 crash_atom::value);
        });
    },
  };
}

// -- one measurement ------------------------------------------------------------------------

struct figure {
  std::uint64_t restarts = 0;
  double wall_ms = 0;
  std::uint64_t events = 0;
  double events_per_s() const { return wall_ms > 0 ? events / (wall_ms / 1e3) : 0; }
};

/// Sum of restarts reported by `target` (which_children), asked from inside the world.
std::uint64_t restart_count(world& w, const caf::actor& target) {
  auto total = std::make_shared<std::uint64_t>(0);
  w.system().spawn([target, total](caf::event_based_actor* self) {
    self->request(target, caf::infinite, which_children_atom::value)
      .then([total](const std::vector<child_info>& rows) {
        for (auto& r : rows)
          *total += r.restarts;
      });
  });
  w.driver().run();
  return *total;
}

enum class kind { supervisor, bare };

figure measure(kind k, std::size_t children, int rounds, std::uint64_t seed) {
  world w{world_options{world_mode::sim, seed, 0, false, {}}};
  auto& sys = w.system();
  caf::actor target;
  if (k == kind::supervisor) {
    supervisor_config cfg;
    cfg.name = "bench";
    // High enough that 1,000 crashes within one period never escalate.
    cfg.flags = supervisor_flags{strategy::one_for_one, 1'000'000'000, 1s};
    for (std::size_t i = 0; i < children; ++i) {
      child_spec spec;
      spec.id = "w" + std::to_string(i);
      spec.start = [](caf::local_actor* self) { return self->spawn(worker); };
      cfg.children.push_back(std::move(spec));
    }
    target = spawn_supervisor(sys, std::move(cfg));
  } else {
    target = sys.spawn(bare_monitor, children);
  }
  auto driver = sys.spawn(crasher, target, w.random().split("bench/crash"));
  w.driver().run(); // the initial start is not measured

  figure f;
  auto events0 = w.driver().events();
  auto wall0 = std::chrono::steady_clock::now();
  for (int r = 0; r < rounds; ++r) {
    caf::anon_send(driver, round_atom::value);
    w.driver().run();
  }
  auto wall = std::chrono::steady_clock::now() - wall0;
  f.wall_ms = std::chrono::duration<double, std::milli>(wall).count();
  f.events = w.driver().events() - events0;

  f.restarts = restart_count(w, target);
  return f;
}

void report(std::size_t children, int rounds, std::uint64_t seed) {
  auto expected = static_cast<std::uint64_t>(children) * static_cast<std::uint64_t>(rounds);
  auto sup = measure(kind::supervisor, children, rounds, seed);
  auto peer = measure(kind::bare, children, rounds, seed);
  std::printf("supervisor: %llu restarts in %.1f ms wall (%.0f events/s, %.0f restarts/s); "
              "peer bare-monitor: %llu restarts in %.1f ms wall (%.0f events/s, %.0f "
              "restarts/s); ratio %.2f\n",
              static_cast<unsigned long long>(sup.restarts), sup.wall_ms, sup.events_per_s(),
              sup.restarts / (sup.wall_ms / 1e3), static_cast<unsigned long long>(peer.restarts),
              peer.wall_ms, peer.events_per_s(), peer.restarts / (peer.wall_ms / 1e3),
              sup.wall_ms / peer.wall_ms);
  if (sup.restarts != expected || peer.restarts != expected) {
    std::fprintf(stderr, "bench_supervisor: expected %llu restarts each\n",
                 static_cast<unsigned long long>(expected));
    std::exit(1);
  }
}

} // namespace

int main(int argc, char** argv) {
  std::size_t children = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 10;
  std::uint64_t seed = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 42;
  std::printf("bench_supervisor: one_for_one, %zu children, sim world, seed %llu\n", children,
              static_cast<unsigned long long>(seed));
  report(children, 1, seed);
  report(children, rounds, seed);
  return 0;
}

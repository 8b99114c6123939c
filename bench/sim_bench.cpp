// bench_sim: how fast the simulated world runs the issue-3 scenario, beside an empty CAF loop.
//
// The scenario: `examples/topologies/v4flash-1k.toml` (DeepSeek-V4.1-Flash on ~1,000 H800s)
// serving the Mooncake conversation trace sped up to about 200 requests/s for one hour of
// virtual time. The trace holds ~3.4 requests/s for ~3,540 s, so it is sped up (×59 at the
// default rate) and tiled: copy c arrives c trace-spans after copy 0. Prefixes: by default each
// copy's block keys are salted with c ("disjoint"), so a copy is a fresh population of users
// with the trace's own reuse structure and hit rate; "shared" keeps the keys, so later copies
// find earlier copies' prompts in the cache (a much lighter prefill load). Records are made as
// the simulation pulls them (run_simulation's stream form), never held all at once.
//
// Printed: wall time of run_simulation (set-up and report included), virtual seconds per wall
// second, events (messages handled + timers fired) per second, peak RSS, requests completed,
// the KV index's entries at the end.
// The named peer, measured in the same run: **caf-ping-pong**, two plain event-based actors
// bouncing one integer on a fresh sim world driven by the same sim_driver, for the same number
// of events as the simulation handled — the events/s of an empty CAF message loop. The ratio
// is troupe's per-event overhead (the actors' work plus the timers the peer does not have).
//
// A progress bar (requests, virtual time, events/s, ETA) goes to stderr when it is a terminal.
//
// Usage: bench_sim [--minutes M=60] [--rate R=200] [--prefixes disjoint|shared]
//                  [--seed S=0] [--topology FILE] [--trace FILE] [--no-peer]
#include "cluster/sim/progress_bar.hpp"
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/trace.hpp"
#include "cluster/topology.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

using ball_atom = caf::atom_constant<caf::atom("ball")>;

caf::behavior pong(caf::event_based_actor* self) {
  return {[self](ball_atom, std::uint64_t n) { return caf::make_message(ball_atom::value, n); }};
}

caf::behavior ping(caf::event_based_actor* self, caf::actor peer, std::uint64_t rounds) {
  self->send(peer, ball_atom::value, std::uint64_t{0});
  return {[self, peer, rounds](ball_atom, std::uint64_t n) {
    if (n + 1 < rounds)
      self->send(peer, ball_atom::value, n + 1);
    else
      self->quit();
  }};
}

struct peer_figure {
  std::uint64_t events = 0;
  double wall_s = 0;
};

/// An empty CAF message loop on the test scheduler: `events` messages bounced between two
/// actors (each message one event, as the sim driver counts them).
peer_figure caf_ping_pong(std::uint64_t events) {
  runtime::world w{runtime::world_options{runtime::world_mode::sim, 0, 0, false, {}}};
  auto& sys = w.system();
  auto p = sys.spawn(pong);
  auto events0 = w.driver().events();
  auto wall0 = std::chrono::steady_clock::now();
  sys.spawn(ping, p, events / 2);
  w.driver().run();
  peer_figure f;
  f.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  f.events = w.driver().events() - events0;
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  return f;
}

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

int usage() {
  std::fprintf(stderr, "usage: bench_sim [--minutes M=60] [--rate R=200] "
                       "[--prefixes disjoint|shared] [--seed S=0] [--topology FILE] "
                       "[--trace FILE] [--no-peer]\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  double minutes = 60;
  double rate = 200;
  std::string prefixes = "disjoint";
  std::uint64_t seed = 0;
  bool peer = true;
  std::string topo_file = TROUPE_SOURCE_DIR "/examples/topologies/v4flash-1k.toml";
  std::string trace_file
    = TROUPE_SOURCE_DIR "/examples/traces/mooncake_fast25_conversation_trace.jsonl";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--no-peer") {
      peer = false;
    } else if ((a == "--minutes" || a == "--rate" || a == "--prefixes" || a == "--seed"
                || a == "--topology" || a == "--trace")
               && (v = value()) != nullptr) {
      if (a == "--minutes")
        minutes = std::atof(v);
      else if (a == "--rate")
        rate = std::atof(v);
      else if (a == "--prefixes")
        prefixes = v;
      else if (a == "--seed")
        seed = std::strtoull(v, nullptr, 10);
      else if (a == "--topology")
        topo_file = v;
      else
        trace_file = v;
    } else {
      return usage();
    }
  }
  if (!(minutes > 0) || !(rate > 0) || (prefixes != "disjoint" && prefixes != "shared"))
    return usage();

  auto topo = cluster::load_topology(topo_file);
  if (!topo.ok()) {
    for (auto& d : topo.errors)
      std::fprintf(stderr, "%s\n", d.to_string().c_str());
    return 1;
  }
  auto loaded = cluster::sim::load_trace(trace_file);
  if (!loaded.ok || loaded.records.size() < 2) {
    std::fprintf(stderr, "bench_sim: cannot load %s\n", trace_file.c_str());
    return 1;
  }
  auto& trace = loaded.records;
  // Speed the trace up to `rate`, and tile it every `period` (its span plus one mean gap, so
  // copies do not overlap and the rate stays even across the seam).
  auto first = trace.front().arrival;
  auto span = trace.back().arrival - first;
  auto gap = span / static_cast<std::int64_t>(trace.size() - 1);
  auto trace_rate = static_cast<double>(trace.size()) / runtime::to_seconds(span + gap);
  auto speedup = rate / trace_rate;
  auto scale = [speedup](runtime::duration d) {
    return std::chrono::duration_cast<runtime::duration>(
      std::chrono::duration<double, std::nano>(static_cast<double>(d.count()) / speedup));
  };
  auto period = scale(span + gap);
  auto window = std::chrono::duration_cast<runtime::duration>(
    std::chrono::duration<double>(minutes * 60.0));
  // Count the records in the window first (the report's total).
  std::uint64_t total = 0;
  for (std::uint64_t c = 0;; ++c) {
    auto base = period * static_cast<std::int64_t>(c);
    if (base >= window)
      break;
    for (auto& r : trace)
      if (base + scale(r.arrival - first) < window)
        ++total;
  }
  bool disjoint = prefixes == "disjoint";
  std::uint64_t copy = 0;
  std::size_t index = 0;
  cluster::sim::record_stream next = [&]() -> std::optional<cluster::sim::request_record> {
    if (index == trace.size()) {
      index = 0;
      ++copy;
    }
    auto arrival = period * static_cast<std::int64_t>(copy) + scale(trace[index].arrival - first);
    if (arrival >= window)
      return std::nullopt;
    auto r = trace[index++];
    r.arrival = arrival;
    if (disjoint && copy > 0) {
      auto salt = splitmix(copy);
      for (auto& b : r.blocks)
        b ^= salt;
      r.session ^= salt;
    }
    return r;
  };

  std::printf("bench_sim: %s, Mooncake conversation trace x%.1f (%.1f req/s), tiled every "
              "%.1f s with %s prefixes, %.0f min virtual, %llu requests, seed %llu\n",
              topo.value->cluster.name.c_str(), speedup, rate, runtime::to_seconds(period),
              prefixes.c_str(), minutes, static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  cluster::sim::sim_options options;
  options.seed = seed;
  options.until = window + 10min; // a bound: the run ends with its last request
  // troupe sim's progress bar on stderr, drawn only when stderr is a terminal.
  cluster::sim::progress_bar bar{stderr, true};
  if (bar.active())
    options.progress = [&bar](const cluster::sim::sim_progress_info& p) {
      char detail[128];
      std::snprintf(detail, sizeof detail, "requests  t=%.0fs virtual  %.2fM events/s",
                    p.virtual_s,
                    static_cast<double>(p.events) / std::max(1e-9, bar.wall_s()) / 1e6);
      bar.update(p.finished, p.total, detail);
    };
  auto wall0 = std::chrono::steady_clock::now();
  auto outcome = cluster::sim::run_simulation(*topo.value, std::move(next), total, options);
  bar.finish();
  auto wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (!outcome) {
    std::fprintf(stderr, "bench_sim: %s\n", outcome.error().c_str());
    return 1;
  }
  auto& rep = outcome->report;
  auto virtual_s = rep["sim"]["virtual_s"].get<double>();
  auto events = rep["sim"]["events"].get<std::uint64_t>();
  auto completed = rep["requests"]["completed"].get<std::uint64_t>();
  auto rss_mib = static_cast<double>(peak_rss_kib()) / 1024.0;
  auto sim_eps = static_cast<double>(events) / wall_s;
  std::printf("troupe sim: %.1f s virtual in %.2f s wall: %.0fx real time, %llu events "
              "(%.0f events/s), peak RSS %.0f MiB, %llu/%llu requests completed, "
              "block hit rate %.1f%%, KV index %llu entries\n",
              virtual_s, wall_s, virtual_s / wall_s, static_cast<unsigned long long>(events),
              sim_eps, rss_mib, static_cast<unsigned long long>(completed),
              static_cast<unsigned long long>(total),
              rep["kv"]["block_hit_rate"].get<double>() * 100,
              static_cast<unsigned long long>(rep["kv"]["store"]["entries"].get<std::uint64_t>()));
  if (peer) {
    auto f = caf_ping_pong(events);
    auto peer_eps = static_cast<double>(f.events) / f.wall_s;
    std::printf("peer caf-ping-pong: %llu events in %.2f s wall (%.0f events/s); "
                "ratio %.1f (troupe's wall per event / an empty CAF loop's)\n",
                static_cast<unsigned long long>(f.events), f.wall_s, peer_eps,
                peer_eps / sim_eps);
  }
  return outcome->finished ? 0 : 1;
}

// The real world's serving graph (cluster/real_graph.hpp) on real devices, as `troupe serve`
// runs it without HTTP: a tiny random model served through the request actors, balancers,
// separate prefill and decode instances and the KV hand-off between their devices. Shared by
// tests/cluster/test_real_graph.cpp (CPU devices) and tests/cuda_host/test_cuda_graph.cpp (the
// devices on cuda_backend, on the emulated device).
#pragma once

#include <doctest/doctest.h>

#include "actors/type_ids.hpp"
#include "cluster/real_graph.hpp"
#include "kernels/generate.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/model_config.hpp"
#include "ports/posix_store.hpp"
#include "runtime/world.hpp"
#include "tests/ports/device_fixture.hpp"

#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <thread>

namespace troupe::test {

using namespace std::chrono_literals;

inline const char* topology_text = R"(
[cluster]
name = "test-real"
model = "deepseek-v4.1-flash"
hardware = "cpu"

[storage]
backend = "posix"
path = "troupe-kv"
capacity = "1GiB"

[[pool]]
name = "prefill"
role = "prefill"
instances = 1
gpus_per_instance = 1

[[pool]]
name = "decode"
role = "decode"
instances = 1
gpus_per_instance = 1
)";

inline cluster::topology test_topology(int decode_instances = 1, int prefill_instances = 1) {
  std::string text = topology_text;
  for (auto [role, n] : {std::pair{"decode", decode_instances}, {"prefill", prefill_instances}}) {
    const std::string one = "role = \"" + std::string(role) + "\"\ninstances = 1";
    text.replace(text.find(one), one.size(),
                 "role = \"" + std::string(role) + "\"\ninstances = " + std::to_string(n));
  }
  auto t = cluster::parse_topology(text, "test-real.toml");
  REQUIRE(t.value);
  return *t.value;
}

/// Counts the hand-offs a device wrapper saw, and can corrupt what the prefill device exports.
struct handoff_log {
  std::atomic<int> exported{0};
  std::atomic<int> imported{0};
  std::atomic<int> refused{0};
  /// Steps with a row that feeds the device's last draw (overlapped scheduling).
  std::atomic<int> fed_drawn{0};
  bool corrupt_exports = false;
};

/// A device port that forwards everything to `inner`, counting overlapped steps and kv_export /
/// kv_import and, when
/// the log says so, flipping one byte of every exported Block KV payload (a planted fault).
inline runtime::device_port spawn_watched(caf::actor_system& sys, runtime::device_port inner,
                                   std::shared_ptr<handoff_log> log) {
  using self_ptr = runtime::device_port::pointer;
  return sys.spawn([inner, log](self_ptr self) -> runtime::device_port::behavior_type {
    return {
      [self, inner, log](const runtime::device_step& s) {
        if (std::any_of(s.batch.begin(), s.batch.end(), [](const auto& r) { return r.feed_drawn; }))
          ++log->fed_drawn;
        return self->delegate(inner, s);
      },
      [self, inner](const runtime::device_release& r) { self->send(inner, r); },
      [self, inner, log](const runtime::kv_export& e) {
        auto rp = self->make_response_promise<runtime::kv_snapshot_ptr>();
        self->request(inner, caf::infinite, e)
          .then(
            [rp, log](runtime::kv_snapshot_ptr snap) mutable {
              ++log->exported;
              if (log->corrupt_exports && snap && !snap->blocks.empty()) {
                auto bad = std::make_shared<runtime::kv_snapshot>(*snap);
                bad->blocks[0].bytes[bad->blocks[0].bytes.size() / 2] ^= 0x40;
                snap = bad;
              } else if (log->corrupt_exports && snap) {
                auto bad = std::make_shared<runtime::kv_snapshot>(*snap);
                bad->swa.bytes[bad->swa.bytes.size() / 2] ^= 0x40;
                snap = bad;
              }
              rp.deliver(std::move(snap));
            },
            [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self, inner, log](const runtime::kv_import& i) {
        auto rp = self->make_response_promise<caf::ok_atom>();
        self->request(inner, caf::infinite, i)
          .then(
            [rp, log](caf::ok_atom ok) mutable {
              ++log->imported;
              rp.deliver(ok);
            },
            [rp, log](caf::error& err) mutable {
              ++log->refused;
              rp.deliver(std::move(err));
            });
        return rp;
      },
      [self, inner](const runtime::kv_keep& k) { self->send(inner, k); },
      [self, inner](const runtime::kv_kept_export& k) { return self->delegate(inner, k); },
      [self, inner](const runtime::kv_restore& r) { return self->delegate(inner, r); },
    };
  });
}

struct served {
  std::vector<std::int32_t> tokens;
  actors::generation_end end;
};

struct fixture {
  /// Device and store metrics (with a store); outlives the world, whose devices report into it.
  runtime::registry metrics;
  runtime::world w{runtime::world_options{runtime::world_mode::real, 0, 2, false,
                                          actors::register_actor_types}};
  std::shared_ptr<handoff_log> log = std::make_shared<handoff_log>();
  /// DSpark's cost curve, measured by the decode device.
  std::shared_ptr<ports::step_profile> profile = std::make_shared<ports::step_profile>();
  cluster::real_graph graph;
  std::int64_t vocab = 0;

  runtime::store_port store;

  explicit fixture(bool corrupt = false, const std::filesystem::path& kv_dir = {},
                   int decode_instances = 1, actors::speculation_setting spec = {},
                   ports::step_profile::points step_times = {}, bool overlap = true,
                   const std::filesystem::path& model_dir = {}, int prefill_instances = 1,
                   bool keep_windows = true, kernels::backend_opener backend = {},
                   std::optional<cluster::topology> topology = {}, std::uint32_t max_batch = 64) {
    profile->set(std::move(step_times));
    log->corrupt_exports = corrupt;
    const auto dir = model_dir.empty() ? model_dirs::tiny() : model_dir;
    auto cfg = kernels::load_model_config(dir);
    REQUIRE(cfg.ok());
    vocab = cfg->text.vocab_size;
    cluster::real_graph_params p;
    p.spec = spec;
    p.overlap = overlap;
    p.keep_windows = keep_windows;
    if (spec.spec == actors::speculation::dspark) {
      p.step_cost = [profile = profile](const runtime::device_step& s) {
        return runtime::from_seconds(profile->seconds(s.tokens));
      };
    }
    p.device = [dir, log = log, this, p_spec = spec, backend](caf::actor_system& sys,
                                                              cluster::pool_role role,
                                                              std::uint32_t id,
                                                              std::uint32_t ranks) {
      ports::cpu_device_params d;
      d.model_dir = dir;
      d.ep_ranks = ranks;
      d.backend = backend;
      d.threads = 1;
      d.engram_map = "identity";
      d.metrics = &metrics;
      // (A second prefill instance's device is "prefill-1", and so on.)
      const std::string pool = role == cluster::pool_role::prefill ? "prefill" : "decode";
      d.name = id == 0 ? pool : pool + "-" + std::to_string(id);
      if (role == cluster::pool_role::decode && p_spec.spec == actors::speculation::dspark)
        d.profile = profile;
      return spawn_watched(sys, ports::spawn_cpu_device(sys, std::move(d)), log);
    };
    if (!kv_dir.empty()) {
      ports::posix_store_params sp;
      sp.directory = kv_dir;
      sp.capacity = 1ull << 30;
      sp.metrics = &metrics;
      store = ports::spawn_posix_store(w.system(), std::move(sp));
      p.store = store;
    }
    p.block_bytes = static_cast<std::uint64_t>(kernels::block_kv_bytes(cfg->text));
    p.max_batch = max_batch;
    p.prefill_chunk = 64;
    p.metrics = &metrics;
    graph = cluster::spawn_real_graph(
      w.system(),
      topology ? *topology : test_topology(decode_instances, prefill_instances), p);
  }

  ~fixture() {
    caf::anon_send_exit(graph.cluster, caf::exit_reason::user_shutdown);
    if (store)
      caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
  }

  /// The value of a sample of /metrics' text ("name{labels}"), or -1.
  double metric(const std::string& sample) const {
    const auto text = metrics.expose();
    auto at = text.find("\n" + sample + " ");
    if (at == std::string::npos)
      return -1;
    return std::stod(text.substr(at + sample.size() + 2));
  }

  /// Waits (bounded) until `blocks` blocks are hits: in the store and committed in the CHECK
  /// role. Returns how many are.
  std::uint64_t wait_for_blocks(caf::scoped_actor& self, std::uint64_t blocks) {
    std::uint64_t held = 0;
    for (int tries = 0; tries < 500 && held < blocks; ++tries) {
      std::uint64_t stored = 0;
      self->request(store, 10s, runtime::store_stats_atom::value)
        .receive([&](const runtime::store_stats& s) { stored = s.objects; },
                 [&](const caf::error& e) { FAIL(w.system().render(e)); });
      self->request(graph.kv, 10s, actors::kv_stats_atom::value)
        .receive([&](const actors::kv_stats& s) {
                   held = std::min(stored, s.entries - s.pending);
                 },
                 [&](const caf::error& e) { FAIL(w.system().render(e)); });
      if (held < blocks)
        std::this_thread::sleep_for(20ms);
    }
    return held;
  }

  actors::generation_request request(std::uint64_t id, std::vector<std::int32_t> prompt,
                                     std::uint32_t max_tokens, caf::actor sink) {
    actors::generation_request g;
    g.id = id;
    g.prompt = std::move(prompt);
    g.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    g.sink = std::move(sink);
    return g;
  }

  /// Submits a request with `self` as the sink.
  void submit(caf::scoped_actor& self, actors::generation_request g) {
    g.sink = caf::actor_cast<caf::actor>(self);
    self->request(graph.service, 30s, std::move(g))
      .receive([](const caf::actor&) {},
               [&](const caf::error& e) { FAIL("refused: " << w.system().render(e)); });
  }

  /// Collects the streams `self` receives into `out` until `ends` more of them have ended.
  void collect(caf::scoped_actor& self, std::map<std::uint64_t, served>& out, std::size_t ends) {
    std::size_t ended = 0;
    while (ended < ends) {
      bool timed_out = false;
      self->receive(
        [&](actors::generation_tokens& t) {
          auto& s = out[t.id].tokens;
          s.insert(s.end(), t.tokens.begin(), t.tokens.end());
        },
        [&](actors::generation_end& e) {
          out[e.id].end = e;
          ++ended;
        },
        caf::after(120s) >> [&] { timed_out = true; });
      REQUIRE_FALSE(timed_out);
    }
  }

  /// Submits every request with `self` as the sink and collects each stream to its end.
  std::map<std::uint64_t, served> run(caf::scoped_actor& self,
                                      std::vector<actors::generation_request> requests) {
    std::map<std::uint64_t, served> out;
    const auto n = requests.size();
    for (auto& g : requests)
      submit(self, std::move(g));
    collect(self, out, n);
    return out;
  }
};

inline std::vector<std::int32_t> prompt_of(std::size_t n, std::uint32_t seed, std::int64_t vocab) {
  std::vector<std::int32_t> t(n);
  for (auto& v : t)
    v = static_cast<std::int32_t>((seed = seed * 1664525u + 1013904223u) >> 8) % vocab;
  return t;
}

/// What `troupe generate --greedy --ignore-eos` gives for `prompt` (batch-invariant mode, as
/// the served devices run).
inline std::vector<std::int32_t> generate_greedy(const std::vector<std::int32_t>& prompt, int n) {
  auto m = kernels::model::load(model_dirs::tiny(), {.threads = 1, .batch_invariant = true});
  REQUIRE(m.ok());
  auto map = kernels::load_engram_token_map(*m, "identity");
  REQUIRE(map.ok());
  REQUIRE(m->set_engram_token_map(std::move(*map)).ok());
  kernels::generate_options o;
  o.max_new = n;
  o.sampling.greedy = true;
  o.stop_at_eos = false;
  std::vector<std::int64_t> p(prompt.begin(), prompt.end());
  auto g = kernels::generate(*m, p, o);
  REQUIRE(g.ok());
  return {g->tokens.begin(), g->tokens.end()};
}

/// A request with a 150-token prompt (more than one 128-token block) gets `troupe generate`'s 12
/// greedy tokens, and the decode instance imported the prefill instance's KV (no recompute).
inline void check_handoff(fixture& f) {
  caf::scoped_actor self{f.w.system()};
  const auto prompt = prompt_of(150, 1, f.vocab);
  auto out = f.run(self, {f.request(1, prompt, 12, {})});
  REQUIRE(out.size() == 1);
  CHECK(out[1].tokens == generate_greedy(prompt, 12));
  CHECK(out[1].end.reason == actors::finish_reason::length);
  CHECK(out[1].end.prompt_tokens == 150);
  CHECK(out[1].end.completion_tokens == 12);
  CHECK(f.log->exported == 1);
  CHECK(f.log->imported == 1);
  CHECK(f.log->refused == 0);
}

} // namespace troupe::test

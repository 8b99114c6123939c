// embed_pipeline: a custom pipeline built from troupe's actors, in the simulated world.
//
// troupe's serving actors are a library: a program of its own can wire a subset of them to
// actors of its own. This one has no request actor, no decode pool and no HTTP entrypoint.
// Its own *prompt source* plays a few multi-turn conversations over two shared system
// prompts; each prompt is matched against troupe's sharded KV store (the CHECK role), routed
// by troupe's prefill_lb (two length buckets) to one of two prefill instances (an EP group
// each, on simulated H200 devices costed by troupe's perf model), prefilled, and its full
// blocks inserted into the KV store so that later turns hit them. Its own *cost auditor* logs the running hit rate and,
// at the end, reconciles its books with the KV store's and the balancer's counters.
//
// Everything runs on the deterministic scheduler in virtual time: the same seed gives the
// same output. The program checks what it can know independently (every request completed,
// each match equals a reference prefix cache kept by the source, the store's and balancer's
// counters agree with the auditor's, both instances served work) and exits 1 if a check
// fails.
#include "actors/instance.hpp"
#include "actors/kv/block_key.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/lb/prefill_lb.hpp"
#include "actors/type_ids.hpp"
#include "cluster/sim/hardware.hpp"
#include "cluster/sim/model_profile.hpp"
#include "cluster/sim/perf_model.hpp"
#include "runtime/log.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/supervisor.hpp"
#include "runtime/world.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace actors = troupe::actors;
namespace runtime = troupe::runtime;
namespace sim = troupe::cluster::sim;

namespace embed {

// -- the pipeline's own messages ------------------------------------------------------------

/// What the source tells the auditor about one finished (or failed) request.
struct audit_record {
  std::uint64_t request = 0;
  bool completed = false;
  std::string failure;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t hit_tokens = 0;
  /// The hit the source's reference cache predicted; -1 when it could not know (an insert
  /// was still in flight when the match was sent).
  std::int64_t expected_hit_tokens = -1;
  actors::instance_id instance = 0;
  runtime::duration ttft{0};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, audit_record& x) {
  return f(caf::meta::type_name("audit_record"), x.request, x.completed, x.failure,
           x.prompt_tokens, x.hit_tokens, x.expected_hit_tokens, x.instance, x.ttft);
}

using arrive_atom = caf::atom_constant<caf::atom("arrive")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

/// What the auditor hands back to main when the run is over.
struct audit_summary {
  std::vector<audit_record> records;
  std::map<actors::instance_id, std::uint64_t> per_instance;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t hit_tokens = 0;
  bool have_kv_stats = false;
  actors::kv_stats kv;
  bool have_lb_counters = false;
  actors::lb_counters lb;
  runtime::time_point last_finished{};
};

// -- the workload -----------------------------------------------------------------------------

struct prompt {
  std::uint64_t id = 0;
  runtime::duration arrival{0};
  std::vector<std::uint32_t> tokens;
};

/// `conversations` conversations of `turns` turns over two 1,024-token system prompts; each
/// turn appends a user message and an assistant reply to the conversation so far. Turn t of
/// every conversation arrives before turn t+1 of any, one second apart.
std::vector<prompt> make_workload(runtime::rng rng, std::uint32_t conversations,
                                  std::uint32_t turns) {
  auto draw = [&rng](std::vector<std::uint32_t>& out, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i)
      out.push_back(static_cast<std::uint32_t>(rng.below(129280)));
  };
  std::vector<std::vector<std::uint32_t>> systems(2);
  for (auto& s : systems)
    draw(s, 1024);
  std::vector<std::vector<std::uint32_t>> history(conversations);
  for (std::uint32_t c = 0; c < conversations; ++c)
    history[c] = systems[c % systems.size()];
  std::vector<prompt> out;
  for (std::uint32_t t = 0; t < turns; ++t) {
    for (std::uint32_t c = 0; c < conversations; ++c) {
      if (t > 0)
        draw(history[c], 64 + rng.below(192)); // the assistant's previous reply
      draw(history[c], 200 + rng.below(600));  // the user's new message
      prompt p;
      p.id = out.size() + 1;
      p.arrival = std::chrono::seconds(out.size());
      p.tokens = history[c];
      out.push_back(std::move(p));
    }
  }
  return out;
}

// -- the source: match -> route -> prefill -> insert, one request at a time per arrival -------

struct source_state {
  std::vector<prompt> prompts;
  actors::kv_check_actor kv;
  actors::prefill_lb_actor lb;
  caf::actor auditor;
  std::uint64_t block_bytes = 0;
  /// The reference prefix cache: every block whose insert has been acknowledged.
  std::set<actors::block_key> inserted;
  std::uint32_t inserts_in_flight = 0;
  std::size_t finished = 0;
  static inline const char* name = "embed_source";
};

using source_ptr = caf::stateful_actor<source_state>*;

void finish(source_ptr self, audit_record rec) {
  auto& st = self->state;
  self->send(st.auditor, std::move(rec));
  if (++st.finished == st.prompts.size()) {
    self->send(st.auditor, done_atom::value);
    self->quit();
  }
}

void admit(source_ptr self, std::size_t index) {
  auto& st = self->state;
  const auto& p = st.prompts[index];
  auto chain = actors::make_chain(std::span<const std::uint32_t>{p.tokens});
  audit_record rec;
  rec.request = p.id;
  rec.prompt_tokens = p.tokens.size();
  if (st.inserts_in_flight == 0) {
    std::int64_t run = 0;
    while (run < static_cast<std::int64_t>(chain.size()) && st.inserted.count(chain[run]) > 0)
      ++run;
    rec.expected_hit_tokens = run * actors::block_tokens;
  }
  auto admitted = self->clock().now();
  auto fail = [self, rec](const char* phase) {
    return [self, rec, phase](caf::error& err) mutable {
      rec.failure = std::string(phase) + ": " + self->system().render(err);
      finish(self, std::move(rec));
    };
  };
  self->request(st.kv, caf::infinite, actors::kv_match{chain, actors::traffic_class::chatbot,
                                                        rec.prompt_tokens})
    .then(
      [self, rec, chain, admitted, fail](actors::kv_match_result& m) mutable {
        auto& st = self->state;
        rec.hit_tokens = m.hit_tokens;
        auto uncached = rec.prompt_tokens - m.hit_tokens;
        self->request(st.lb, caf::infinite, actors::prefill_route{rec.request, uncached})
          .then(
            [self, rec, chain, admitted, fail, m, uncached](actors::prefill_assignment& a) mutable {
              auto& st = self->state;
              rec.instance = a.instance;
              actors::prefill_job job{rec.request, rec.prompt_tokens, m.hit_tokens,
                                      m.hit_blocks * st.block_bytes};
              auto instance = a.instance;
              self->request(a.engine, caf::infinite, job)
                .then(
                  [self, rec, chain, admitted, fail, uncached,
                   instance](actors::prefill_done& d) mutable {
                    auto& st = self->state;
                    self->send(st.lb, actors::prefill_release{instance, uncached});
                    rec.ttft = d.finished - admitted;
                    ++st.inserts_in_flight;
                    self->request(st.kv, caf::infinite,
                                  actors::kv_insert{chain, actors::traffic_class::chatbot})
                      .then(
                        [self, rec, chain](actors::kv_insert_result&) mutable {
                          auto& st = self->state;
                          --st.inserts_in_flight;
                          st.inserted.insert(chain.begin(), chain.end());
                          rec.completed = true;
                          finish(self, std::move(rec));
                        },
                        fail("insert"));
                  },
                  [self, rec, instance, uncached](caf::error& err) mutable {
                    self->send(self->state.lb, actors::prefill_release{instance, uncached});
                    rec.failure = "prefill: " + self->system().render(err);
                    finish(self, std::move(rec));
                  });
            },
            fail("route"));
      },
      fail("match"));
}

caf::behavior source_fn(source_ptr self, std::vector<prompt> prompts, actors::kv_check_actor kv,
                        actors::prefill_lb_actor lb, caf::actor auditor,
                        std::uint64_t block_bytes) {
  auto& st = self->state;
  st.prompts = std::move(prompts);
  st.kv = std::move(kv);
  st.lb = std::move(lb);
  st.auditor = std::move(auditor);
  st.block_bytes = block_bytes;
  // Arrivals are timers on the actor clock: virtual time in the simulated world.
  for (std::size_t i = 0; i < st.prompts.size(); ++i)
    self->delayed_send(self, st.prompts[i].arrival, arrive_atom::value,
                       static_cast<std::uint64_t>(i));
  return {
    [self](arrive_atom, std::uint64_t index) { admit(self, index); },
  };
}

// -- the auditor: running hit rate, then reconciliation with the store and the balancer -------

struct auditor_state {
  std::shared_ptr<audit_summary> out;
  actors::kv_check_actor kv;
  actors::prefill_lb_actor lb;
  static inline const char* name = "embed_auditor";
};

using auditor_ptr = caf::stateful_actor<auditor_state>*;

caf::behavior auditor_fn(auditor_ptr self, std::shared_ptr<audit_summary> out,
                         actors::kv_check_actor kv, actors::prefill_lb_actor lb) {
  self->state.out = std::move(out);
  self->state.kv = std::move(kv);
  self->state.lb = std::move(lb);
  return {
    [self](audit_record& rec) {
      auto& s = *self->state.out;
      auto log = runtime::log::get("auditor");
      if (rec.completed) {
        s.prompt_tokens += rec.prompt_tokens;
        s.hit_tokens += rec.hit_tokens;
        ++s.per_instance[rec.instance];
        s.last_finished = std::max(s.last_finished, self->clock().now());
        log->info("request {} on prefill/{}: {}/{} tokens cached, ttft {:.1f} ms; hit rate so "
                  "far {:.1f}%",
                  rec.request, rec.instance, rec.hit_tokens, rec.prompt_tokens,
                  runtime::to_seconds(rec.ttft) * 1e3,
                  100.0 * static_cast<double>(s.hit_tokens)
                    / static_cast<double>(s.prompt_tokens));
      } else {
        log->warn("request {} failed: {}", rec.request, rec.failure);
      }
      s.records.push_back(std::move(rec));
    },
    [self](done_atom) {
      auto& st = self->state;
      self->request(st.kv, caf::infinite, actors::kv_stats_atom::value)
        .then([self](actors::kv_stats& kv) {
          auto& st = self->state;
          st.out->kv = kv;
          st.out->have_kv_stats = true;
          self->request(st.lb, caf::infinite, actors::lb_stats_atom::value)
            .then([self](actors::lb_counters& c) {
              self->state.out->lb = std::move(c);
              self->state.out->have_lb_counters = true;
              self->quit();
            });
        });
    },
  };
}

} // namespace embed

int main() {
  using namespace embed;
  constexpr std::uint32_t conversations = 4;
  constexpr std::uint32_t turns = 3;
  constexpr std::uint32_t prefill_instances = 2;
  constexpr std::uint32_t ranks = 8;
  constexpr std::uint64_t bucket_bound = 1024;

  // The simulated devices are costed by troupe's perf model (shipped model configs).
  auto model = sim::resolve_model("deepseek-v4.1-flash", EMBED_MODELS_DIR);
  auto hw = sim::resolve_hardware("h200");
  if (!model || !hw) {
    std::fprintf(stderr, "embed: %s%s\n", model ? "" : model.error().c_str(),
                 hw ? "" : hw.error().c_str());
    return 1;
  }
  auto block_bytes = static_cast<std::uint64_t>(model->kv_bytes_per_block());

  // The world: simulated, seeded; troupe's actor message types registered, then ours.
  runtime::world_options opts;
  opts.mode = runtime::world_mode::sim;
  opts.seed = 2026;
  opts.configure = [](caf::actor_system_config& cfg) {
    actors::register_actor_types(cfg);
    cfg.add_message_type<audit_record>("audit_record");
  };
  runtime::world w{opts};
  auto& sys = w.system();
  auto origin = w.now();

  // troupe's control actors: a 2-shard KV store and the prefill balancer.
  actors::kv_index_params kv_params;
  kv_params.capacity_bytes = 1ull << 30; // per shard; this run never evicts
  kv_params.block_bytes = block_bytes;
  auto kv = actors::spawn_sharded_kv_store(sys, kv_params, 2);
  // Two length buckets split at 1,024 uncached tokens: cold first turns go to one instance,
  // warm later turns (mostly cached) to the other.
  actors::prefill_lb_params lb_params;
  lb_params.balancer.bucket_bounds = {bucket_bound};
  auto lb = actors::spawn_prefill_lb(sys, lb_params);

  // troupe's prefill instances under a pool supervisor; their ports are simulated.
  actors::instance_ports ports;
  auto per_gpu = sim::make_step_cost(*model, *hw, ranks);
  ports.device = [per_gpu](caf::local_actor* self, actors::instance_id, std::uint32_t rank,
                           std::uint32_t) {
    // The leader rank's step covers the EP group: cost one GPU's share of the batch.
    runtime::step_cost_fn cost = [per_gpu, rank](const runtime::device_step& s) {
      if (rank != 0)
        return runtime::duration{0};
      auto share = [](std::uint64_t x) { return (x + ranks - 1) / ranks; };
      runtime::device_step g = s;
      g.tokens = share(s.tokens);
      g.sequences = static_cast<std::uint32_t>(share(s.sequences));
      g.context_tokens = share(s.context_tokens);
      return per_gpu(g);
    };
    return runtime::spawn_sim_device(self->system(), std::move(cost));
  };
  ports.link = [](caf::local_actor* self, actors::instance_id) {
    return runtime::spawn_sim_link(self->system(), runtime::sim_link_params{50e9, 10us});
  };
  runtime::supervisor_config pool{"prefill", {runtime::strategy::one_for_one, 10, 1h}, {}};
  for (actors::instance_id i = 0; i < prefill_instances; ++i) {
    actors::prefill_engine_params engine;
    engine.instance = i;
    engine.fetch_layers = static_cast<std::uint32_t>(model->layers.size());
    pool.children.push_back(actors::prefill_instance("prefill", i, ranks, engine, ports, lb));
  }
  auto pool_sup = runtime::spawn_supervisor(sys, std::move(pool));
  // Let the engines start and announce themselves to the balancer (no time passes).
  w.driver().run_for(0s);

  // Our own actors.
  auto summary = std::make_shared<audit_summary>();
  auto auditor = sys.spawn(auditor_fn, summary, kv, lb);
  auto prompts = make_workload(w.random().split("embed/workload"), conversations, turns);
  auto total = prompts.size();
  sys.spawn(source_fn, std::move(prompts), kv, lb, auditor, block_bytes);

  // Drive the virtual clock until nothing is left to do.
  auto stop = w.driver().run();

  // -- the summary and the checks ---------------------------------------------------------
  auto& s = *summary;
  std::vector<std::string> problems;
  auto check = [&problems](bool ok, std::string what) {
    if (!ok)
      problems.push_back(std::move(what));
  };
  std::uint64_t completed = 0, predicted = 0;
  for (auto& r : s.records) {
    if (!r.completed)
      continue;
    ++completed;
    if (r.expected_hit_tokens >= 0) {
      ++predicted;
      check(static_cast<std::uint64_t>(r.expected_hit_tokens) == r.hit_tokens,
            "request " + std::to_string(r.request) + ": KV store hit " + std::to_string(r.hit_tokens)
              + " tokens, the reference cache " + std::to_string(r.expected_hit_tokens));
    }
  }
  check(stop == runtime::stop_reason::quiescent,
        std::string("the world did not become quiet: ") + runtime::to_string(stop));
  check(completed == total, std::to_string(completed) + " of " + std::to_string(total)
                              + " requests completed");
  check(predicted > 0, "no match could be predicted");
  check(s.hit_tokens > 0, "no prefix was ever hit");
  check(s.have_kv_stats, "no kv_stats from the KV store");
  if (s.have_kv_stats) {
    check(s.kv.lookups == total, "the KV store counted " + std::to_string(s.kv.lookups)
                                   + " matches, not " + std::to_string(total));
    check(s.kv.hit_tokens == s.hit_tokens,
          "the KV store counted " + std::to_string(s.kv.hit_tokens) + " hit tokens, the auditor "
            + std::to_string(s.hit_tokens));
  }
  check(s.have_lb_counters, "no counters from prefill_lb");
  // The balancer's per-bucket counts must match the buckets of the uncached lengths.
  std::vector<std::uint64_t> routed, expected_routed(2, 0);
  for (std::size_t i = 0; i < s.lb.names.size(); ++i)
    if (s.lb.names[i].rfind("routed_", 0) == 0)
      routed.push_back(s.lb.values[i]);
  for (auto& r : s.records)
    if (r.completed)
      ++expected_routed[r.prompt_tokens - r.hit_tokens >= bucket_bound ? 1 : 0];
  if (s.have_lb_counters)
    check(routed == expected_routed, "prefill_lb's routed counts per bucket differ from the "
                                     "buckets of the uncached lengths");
  check(s.per_instance.size() == prefill_instances, "not every prefill instance served work");

  auto rate = s.prompt_tokens > 0
                ? 100.0 * static_cast<double>(s.hit_tokens) / static_cast<double>(s.prompt_tokens)
                : 0.0;
  std::printf("embed_pipeline: %llu/%zu requests completed in %.3f s of virtual time "
              "(%llu events)\n",
              static_cast<unsigned long long>(completed), total,
              runtime::to_seconds(s.last_finished - origin),
              static_cast<unsigned long long>(w.driver().events()));
  std::printf("  prompt tokens %llu, cached %llu: token hit rate %.1f%% "
              "(%llu/%llu matches predicted by the reference cache)\n",
              static_cast<unsigned long long>(s.prompt_tokens),
              static_cast<unsigned long long>(s.hit_tokens), rate,
              static_cast<unsigned long long>(predicted),
              static_cast<unsigned long long>(completed));
  std::printf("  kv store: %llu entries, %llu lookups, %llu hit blocks\n",
              static_cast<unsigned long long>(s.kv.entries),
              static_cast<unsigned long long>(s.kv.lookups),
              static_cast<unsigned long long>(s.kv.hit_blocks));
  for (auto& [id, n] : s.per_instance)
    std::printf("  prefill/%u served %llu requests\n", id, static_cast<unsigned long long>(n));
  for (std::size_t i = 0; i < s.lb.names.size(); ++i)
    std::printf("  prefill_lb %s = %llu\n", s.lb.names[i].c_str(),
                static_cast<unsigned long long>(s.lb.values[i]));
  if (!problems.empty()) {
    for (auto& p : problems)
      std::printf("CHECK FAILED: %s\n", p.c_str());
    return 1;
  }
  std::printf("embed_pipeline: all checks passed\n");
  (void)pool_sup;
  return 0;
}

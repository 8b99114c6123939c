#include "cluster/sim/simulation.hpp"

#include "actors/autoscaler/autoscaler.hpp"
#include "cluster/autoscaling.hpp"
#include "actors/fault_injector.hpp"
#include "actors/instance.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/lb/decode_lb.hpp"
#include "actors/lb/expert_balancer.hpp"
#include "actors/lb/prefill_lb.hpp"
#include "actors/lb/vision_lb.hpp"
#include "actors/request/request.hpp"
#include "actors/type_ids.hpp"
#include "cluster/sim/capacity.hpp"
#include "cluster/sim/fault_injection.hpp"
#include "cluster/sim/hardware.hpp"
#include "cluster/sim/history_checker.hpp"
#include "cluster/sim/model_profile.hpp"
#include "cluster/sim/perf_model.hpp"
#include "cluster/sim/surge.hpp"
#include "cluster/sim/trace_source.hpp"
#include "runtime/errors.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/supervisor.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>

#include <fmt/format.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <tuple>
#include <set>
#include <memory>
#include <optional>

namespace troupe::cluster::sim {

namespace {

using namespace std::chrono_literals;


/// Device time per instance, accumulated by the cost functions (one thread in the sim).
///
/// A cost function has no clock of its own: it reads the world's virtual clock and mirrors
/// the simulated device's queue (a step starts when it arrives or when the previous one ends,
/// whichever is later), so each step's busy time lands in the one-second buckets it covers.
/// Everything here is virtual time, so the table is as deterministic as the run.
///
/// It also keeps what the honest figures of the report need (docs/report.md): the GPU time
/// each instance held (every rank's device from its start to its exit or the end of the run,
/// so autoscaled instances count for the time they existed and a down instance not at all),
/// each decode step's batch against the incarnation's capacity, and the KV it holds against
/// the incarnation's memory — a step holding more is a violation of the memory invariant.
struct busy_table {
  const runtime::world* clock = nullptr;
  runtime::time_point origin{};
  struct instance {
    double seconds = 0;
    /// Busy GPU-seconds: step time × the incarnation's GPUs.
    double gpu_seconds = 0;
    runtime::time_point free_at{};
    /// Busy seconds in [i, i+1) s after `origin`.
    std::vector<double> per_second;
    /// Decode steps: count, sequences, the batch capacity summed over them; KV held × step
    /// time and KV capacity × step time (token-seconds); the highest KV / capacity.
    std::uint64_t decode_steps = 0;
    double sequences = 0;
    double batch_capacity = 0;
    double kv_token_s = 0;
    double kv_capacity_token_s = 0;
    double kv_peak = 0;
    /// Model FLOPs and the HBM bytes the steps had to read at least (instance_cost).
    double flops = 0;
    double hbm_bytes = 0;
  };
  std::map<std::string, instance> by_key;
  /// Every rank device started: its instance and when it started and (once it exited) ended.
  struct device_life {
    std::string key;
    bool leader = false;
    runtime::time_point start{};
    std::optional<runtime::time_point> end;
  };
  std::vector<device_life> devices;
  /// Decode steps that held more KV than their instance's memory (the first few).
  std::vector<std::string> memory_violations;
  std::uint64_t memory_violation_count = 0;
  /// The first internal failure of a cost function (the run fails with it).
  std::string internal_failure;

  /// A step of `d` on instance `in` (an entry of `by_key`, which stays where it is: none is
  /// erased; `gpus` GPUs), arriving now and starting no earlier than `prepare` later
  /// (device_step::prepare), after the steps before it.
  void add(instance& in, runtime::duration d, std::uint32_t gpus, runtime::duration prepare) {
    in.seconds += runtime::to_seconds(d);
    in.gpu_seconds += runtime::to_seconds(d) * gpus;
    if (clock == nullptr)
      return;
    auto start = std::max(clock->now() + prepare, in.free_at);
    auto end = start + d;
    in.free_at = end;
    auto a = std::max(0.0, runtime::to_seconds(start - origin));
    auto b = std::max(a, runtime::to_seconds(end - origin));
    for (auto i = static_cast<std::size_t>(a); static_cast<double>(i) < b; ++i) {
      if (in.per_second.size() <= i)
        in.per_second.resize(i + 1);
      auto lo = std::max(a, static_cast<double>(i));
      auto hi = std::min(b, static_cast<double>(i + 1));
      in.per_second[i] += hi - lo;
    }
  }

  /// A decode step of `d` on instance `key` (its entry `in`): `sequences` of `capacity`, holding `kv` tokens of
  /// the `kv_capacity` its memory has room for.
  void decode_step(const std::string& key, instance& in, runtime::duration d,
                   std::uint64_t sequences, std::uint64_t capacity, std::uint64_t kv,
                   std::uint64_t kv_capacity) {
    auto s = runtime::to_seconds(d);
    ++in.decode_steps;
    in.sequences += static_cast<double>(sequences);
    in.batch_capacity += static_cast<double>(capacity);
    in.kv_token_s += static_cast<double>(kv) * s;
    in.kv_capacity_token_s += static_cast<double>(kv_capacity) * s;
    if (kv_capacity > 0)
      in.kv_peak = std::max(in.kv_peak, static_cast<double>(kv) / static_cast<double>(kv_capacity));
    if (kv > kv_capacity) {
      if (memory_violations.size() < 10)
        memory_violations.push_back(fmt::format(
          "{} held {} KV tokens in a decode step at {:.6f} s, above the {} its HBM holds "
          "after weights",
          key, kv, clock == nullptr ? 0.0 : runtime::to_seconds(clock->now() - origin),
          kv_capacity));
      ++memory_violation_count;
    }
  }

  /// GPU-seconds each instance held up to `end` (a device still running counts to `end`).
  std::map<std::string, double> held_gpu_seconds(runtime::time_point end) const {
    std::map<std::string, double> out;
    for (auto& d : devices) {
      auto to = std::min(end, d.end.value_or(end));
      out[d.key] += std::max(0.0, runtime::to_seconds(to - d.start));
    }
    return out;
  }

  /// Seconds each instance was up to `end`: its leader rank's device lifetimes.
  std::map<std::string, double> leader_seconds(runtime::time_point end) const {
    std::map<std::string, double> out;
    for (auto& d : devices)
      if (d.leader)
        out[d.key] += std::max(0.0, runtime::to_seconds(std::min(end, d.end.value_or(end)) - d.start));
    return out;
  }
};

/// A pool's routed experts as the simulated world sees them (sim_params::expert_skew,
/// expert_drift, eplb): the load, Zipf-skewed, drifts one rank along every `drift`; the
/// placement is contiguous, or the expert balancer's latest (published by its actor), placed
/// for each EP size the pool's instances run at (an instance re-formed after a failure places
/// by the same load). Each step asks the balancedness of its EP group now.
struct pool_experts {
  model_profile model;
  double skew = 0;
  runtime::duration drift{0};
  runtime::time_point origin{};
  /// The load the balancer's latest placement was computed from (empty: contiguous ranges).
  std::vector<double> placed_load;
  std::uint64_t version = 0;
  std::uint64_t published = 0;
  std::map<std::uint32_t, actors::expert_placement> placements;
  std::map<std::tuple<std::uint64_t, std::uint32_t, std::uint64_t>, double> cache;
  /// Balancedness × step seconds and step seconds, of every step costed (the run's mean).
  double weighted = 0, seconds = 0;

  std::uint64_t shift_at(runtime::time_point t) const {
    if (drift <= runtime::duration{0} || t <= origin)
      return 0;
    return static_cast<std::uint64_t>((t - origin) / drift);
  }

  /// The mean load over [from, to] (the load at `to` when the span is empty).
  std::vector<double> load_over(runtime::time_point from, runtime::time_point to) const {
    from = std::max(from, origin);
    if (to <= from)
      return expert_loads(model, skew, shift_at(to));
    std::vector<double> sum(model.routed_experts, 0.0);
    for (auto t = from; t < to;) {
      const auto k = shift_at(t);
      const auto until = drift > runtime::duration{0}
                           ? std::min(to, origin + drift * static_cast<std::int64_t>(k + 1))
                           : to;
      const double w = runtime::to_seconds(until - t);
      const auto l = expert_loads(model, skew, k);
      for (std::size_t e = 0; e < sum.size(); ++e)
        sum[e] += w * l[e];
      t = until;
    }
    return sum;
  }

  void publish(const std::vector<double>& load) {
    placed_load = load;
    ++version;
    ++published;
    placements.clear();
    cache.clear();
  }

  double balance(std::uint32_t ep, runtime::time_point t) {
    if (ep <= 1 || model.routed_experts == 0)
      return 1.0;
    const auto k = shift_at(t);
    const auto key = std::tuple{version, ep, k};
    if (auto i = cache.find(key); i != cache.end())
      return i->second;
    const auto load = expert_loads(model, skew, k);
    double b = 1.0;
    if (placed_load.empty()) {
      b = actors::contiguous_placement(load, ep).balancedness();
    } else {
      auto p = placements.find(ep);
      if (p == placements.end()) {
        auto placed = actors::place_experts({placed_load, ep, eplb_slots_per_rank(model, ep)});
        p = placements.emplace(ep, std::get<actors::expert_placement>(std::move(placed))).first;
      }
      b = actors::balancedness_under(p->second, load);
    }
    if (cache.size() > 4096)
      cache.clear();
    cache.emplace(key, b);
    return b;
  }
};

/// One GPU's share of an instance's step over `ranks` GPUs: its sizes divided, rounded up (its
/// batch's content is not needed to cost it, so it is not copied).
runtime::device_step gpu_share(const runtime::device_step& s, std::uint32_t ranks) {
  auto share = [ranks](std::uint64_t x) { return (x + ranks - 1) / ranks; };
  runtime::device_step g{s.id,
                         s.phase,
                         share(s.tokens),
                         static_cast<std::uint32_t>(share(s.sequences)),
                         share(s.context_tokens),
                         static_cast<std::uint32_t>(share(s.proposing)),
                         static_cast<std::uint32_t>(share(s.masks)),
                         {}};
  g.first_constraint_age = s.first_constraint_age;  // a wait for the host, on every GPU alike
  return g;
}

/// A device cost for a rank of an instance incarnation with `ranks` ranks and EP `ep`: the
/// engine's step (on the leader) covers the whole instance, so each GPU's share is 1/ranks of
/// it, times the instance's slowdown factor. Decode steps are also checked against the
/// incarnation's batch capacity and KV memory (`kv_capacity` tokens).
///
/// Each step also adds its model FLOPs (2 × active parameters × tokens, the lm head once per
/// sequence in prefill; attention's score and value products not counted) and the HBM bytes it
/// must read at least (every weight on the instance's GPUs once, and the block KV it attends
/// over), for the report's MFU and HBM-bandwidth share.
runtime::step_cost_fn instance_cost(const model_profile& model, const hardware_profile& hw,
                                    std::uint32_t ep, const perf_options& opt,
                                    std::uint32_t ranks, std::shared_ptr<busy_table> busy,
                                    std::string key, std::shared_ptr<const fleet_state> fleet,
                                    std::uint64_t batch_capacity, std::uint64_t kv_capacity,
                                    std::shared_ptr<pool_experts> experts = nullptr) {
  auto per_gpu = make_step_cost(model, hw, ep, opt);
  // With an expert load (skewed, drifting, placed by the balancer), each step waits for the
  // busiest rank under the placement of the moment: the cost function follows its balancedness.
  auto balanced = std::make_shared<double>(opt.moe_balance);
  auto restep = [model, hw, ep, opt](double balance) {
    auto o = opt;
    o.moe_balance = balance;
    return make_step_cost(model, hw, ep, o);
  };
  const double head = double(model.hidden) * model.vocab;
  const double decode_flops = 2.0 * model.active_params_decode;
  const double prefill_flops = 2.0 * model.active_params_prefill;
  const double weights = weight_bytes_per_gpu(model, ep) * ranks;
  const double kv_bytes = model.kv_bytes_per_token;
  // The instance's entry in the busy table, found at its first step.
  busy_table::instance* in = nullptr;
  return [per_gpu, ranks, busy, key, fleet, batch_capacity, kv_capacity, head, decode_flops,
          prefill_flops, weights, kv_bytes, experts, balanced, restep, ep,
          in](const runtime::device_step& s) mutable {
    const auto g = gpu_share(s, ranks);
    // An exception here (a bug, memory exhausted) must not escape into the device actor,
    // whose default handler would print it on stdout and carry on: it is recorded, and the
    // run fails with it (run_simulation's error, a non-zero exit of troupe sim).
    try {
      if (experts && busy->clock != nullptr) {
        const double b = experts->balance(ep, busy->clock->now());
        if (b != *balanced) {
          *balanced = b;
          per_gpu = restep(b);
        }
      }
      auto d = per_gpu(g);
      if (experts && s.tokens > 0) {
        experts->weighted += *balanced * runtime::to_seconds(d);
        experts->seconds += runtime::to_seconds(d);
      }
      if (auto f = fleet->factor(key); f != 1.0)
        d = runtime::from_seconds(runtime::to_seconds(d) * f);
      if (in == nullptr)
        in = &busy->by_key[key];
      busy->add(*in, d, ranks, s.prepare);
      if (s.tokens > 0) {
        in->flops += s.phase == runtime::step_phase::decode
                       ? decode_flops * static_cast<double>(s.tokens)
                       : prefill_flops * static_cast<double>(s.tokens)
                           + 2.0 * head * static_cast<double>(std::max<std::uint32_t>(s.sequences, 1));
        in->hbm_bytes += weights + kv_bytes * static_cast<double>(s.context_tokens);
      }
      if (s.phase == runtime::step_phase::decode)
        busy->decode_step(key, *in, d, s.sequences, batch_capacity, s.context_tokens,
                          kv_capacity);
      return d;
    } catch (const std::exception& e) {
      if (busy->internal_failure.empty())
        busy->internal_failure = "the device of " + key + " failed: " + e.what();
      return runtime::duration{0};
    }
  };
}

double percentile(std::vector<double> xs, double p) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  auto rank = p / 100.0 * static_cast<double>(xs.size() - 1);
  auto lo = static_cast<std::size_t>(std::floor(rank));
  auto hi = static_cast<std::size_t>(std::ceil(rank));
  return xs[lo] + (xs[hi] - xs[lo]) * (rank - static_cast<double>(lo));
}

nlohmann::json percentiles(const std::vector<double>& xs) {
  return {{"p50", percentile(xs, 50)}, {"p90", percentile(xs, 90)}, {"p99", percentile(xs, 99)}};
}

/// Rounds to 6 significant decimals so that reports compare as text across compilers.
double tidy(double x) {
  return std::round(x * 1e6) / 1e6;
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

template <class T, class Handle, class... Ts>
std::shared_ptr<std::optional<T>> ask(caf::actor_system& sys, const Handle& dest, Ts... xs) {
  auto out = std::make_shared<std::optional<T>>();
  sys.spawn([dest, out, xs...](caf::event_based_actor* self) {
    self->request(dest, caf::infinite, xs...).then([out](T& x) { *out = std::move(x); });
  });
  return out;
}

/// The time series of a run, binned by virtual time, computed from the outcomes.
nlohmann::json time_series(const std::vector<actors::request_outcome>& outcomes,
                           runtime::time_point origin, double span_s,
                           const std::string& prefill_pool, const std::string& decode_pool,
                           const busy_table& busy) {
  auto bin_s = std::max(1.0, std::ceil(span_s / 120.0));
  auto bins = static_cast<std::size_t>(std::ceil(span_s / bin_s)) + 1;
  std::vector<double> input(bins), output(bins), in_flight(bins), hit_tokens(bins),
    prompt_tokens(bins);
  std::vector<std::vector<double>> ttft(bins);
  auto at = [&](runtime::time_point t) {
    auto s = runtime::to_seconds(t - origin);
    return std::min(bins - 1, static_cast<std::size_t>(std::max(0.0, s) / bin_s));
  };
  for (auto& o : outcomes) {
    if (!o.completed)
      continue;
    auto b = at(o.finished);
    input[b] += static_cast<double>(o.input_tokens);
    output[b] += static_cast<double>(o.output_tokens);
    auto a = at(o.admitted);
    ttft[a].push_back(runtime::to_seconds(o.first_token - o.admitted) * 1e3);
    hit_tokens[a] += static_cast<double>(o.hit_tokens);
    prompt_tokens[a] += static_cast<double>(o.input_tokens);
    for (auto i = a; i <= b; ++i)
      in_flight[i] += 1;
  }
  nlohmann::json series;
  series["bin_s"] = bin_s;
  for (std::size_t i = 0; i < bins; ++i) {
    series["t_s"].push_back(tidy(static_cast<double>(i) * bin_s));
    series["input_tokens_per_s"].push_back(tidy(input[i] / bin_s));
    series["output_tokens_per_s"].push_back(tidy(output[i] / bin_s));
    series["requests_in_flight"].push_back(in_flight[i]);
    series["token_hit_rate"].push_back(
      tidy(prompt_tokens[i] > 0 ? hit_tokens[i] / prompt_tokens[i] : 0));
    series["ttft_p50_ms"].push_back(tidy(percentile(ttft[i], 50)));
    series["ttft_p99_ms"].push_back(tidy(percentile(ttft[i], 99)));
  }

  // Per instance: mean requests held per bin (time-weighted), and the device's busy share.
  // Prefill holds a request from routing (which takes no virtual time after admission) to its
  // first token, decode from the first token to the end. Every instance of the busy table
  // gets a line, idle or not.
  std::map<std::string, std::vector<double>> load;
  for (auto& [key, in] : busy.by_key)
    load[key].assign(bins, 0.0);
  auto hold = [&](const std::string& key, runtime::time_point from, runtime::time_point to) {
    auto& v = load[key];
    v.resize(bins, 0.0);
    auto a = std::max(0.0, runtime::to_seconds(from - origin));
    auto b = std::max(a, runtime::to_seconds(to - origin));
    for (auto i = static_cast<std::size_t>(a / bin_s); i < bins && static_cast<double>(i) * bin_s < b;
         ++i) {
      auto lo = std::max(a, static_cast<double>(i) * bin_s);
      auto hi = std::min(b, static_cast<double>(i + 1) * bin_s);
      if (hi > lo)
        v[i] += (hi - lo) / bin_s;
    }
  };
  for (auto& o : outcomes) {
    if (!o.completed)
      continue;
    hold(prefill_pool + "/" + std::to_string(o.prefill_instance), o.admitted, o.first_token);
    hold(decode_pool + "/" + std::to_string(o.decode_instance), o.first_token, o.finished);
  }
  series["pools"] = {prefill_pool, decode_pool};
  auto step = static_cast<std::size_t>(bin_s);
  for (auto& [key, v] : load) {
    auto& out = series["instance_load"][key];
    for (auto x : v)
      out.push_back(tidy(x));
  }
  for (auto& [key, in] : busy.by_key) {
    auto& out = series["instance_busy"][key];
    for (std::size_t i = 0; i < bins; ++i) {
      double s = 0;
      for (std::size_t k = i * step; k < (i + 1) * step && k < in.per_second.size(); ++k)
        s += in.per_second[k];
      out.push_back(tidy(std::min(1.0, s / bin_s)));
    }
  }
  return series;
}

/// `report.gpus` (docs/report.md): the GPU time the instances held up to `end` and how busy it
/// was, what it produced (completed requests' tokens per GPU-second and per GPU-hour), the
/// decode batches against their capacity and the KV held against the memory, in total, per
/// pool and per instance. A step that runs past `end` or past its instance's failure counts
/// only up to the GPU time its instance held.
nlohmann::json gpu_figures(const busy_table& busy, const topology& topo, runtime::time_point end,
                           std::uint64_t in_tokens, std::uint64_t out_tokens,
                           const hardware_profile& hw) {
  const int gpus_per_node = hw.gpus_per_node;
  auto held = busy.held_gpu_seconds(end);
  auto up = busy.leader_seconds(end);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  struct sums {
    double held = 0, busy = 0, sequences = 0, capacity = 0, kv = 0, kv_capacity = 0, kv_peak = 0;
    double flops = 0, hbm_bytes = 0;
    std::uint64_t decode_steps = 0;
  };
  std::map<std::string, sums> pools;
  sums all;
  nlohmann::json per_instance = nlohmann::json::object();
  nlohmann::json per_instance_up = nlohmann::json::object();
  // Every instance that ran a step or held a GPU (one autoscaled in may never have run one).
  std::set<std::string> keys;
  for (auto& [key, in] : busy.by_key)
    keys.insert(key);
  for (auto& [key, h] : held)
    keys.insert(key);
  const busy_table::instance idle{};
  for (auto& key : keys) {
    auto i = busy.by_key.find(key);
    const auto& in = i == busy.by_key.end() ? idle : i->second;
    auto pool = key.substr(0, key.find('/'));
    auto h = held.count(key) != 0 ? held.at(key) : 0.0;
    auto b = std::min(in.gpu_seconds, h);
    auto u = up.count(key) != 0 ? up.at(key) : 0.0;
    per_instance[key] = tidy(std::min(1.0, ratio(in.seconds, u)));
    per_instance_up[key] = tidy(u);
    for (auto* x : {&pools[pool], &all}) {
      x->held += h;
      x->busy += b;
      x->decode_steps += in.decode_steps;
      x->sequences += in.sequences;
      x->capacity += in.batch_capacity;
      x->kv += in.kv_token_s;
      x->kv_capacity += in.kv_capacity_token_s;
      x->kv_peak = std::max(x->kv_peak, in.kv_peak);
      x->flops += in.flops;
      x->hbm_bytes += in.hbm_bytes;
    }
  }
  std::uint64_t initial = 0;
  for (auto& p : topo.pools)
    initial += p.gpus(p.instances.initial);
  nlohmann::json per_pool = nlohmann::json::object();
  for (auto& p : topo.pools) {
    auto& x = pools[p.name];
    nlohmann::json j = {{"gpu_hours_held", tidy(x.held / 3600)},
                        {"busy_share", tidy(ratio(x.busy, x.held))},
                        {"mfu", tidy(ratio(x.flops, x.held * hw.fp8_flops))},
                        {"hbm_bandwidth_share", tidy(ratio(x.hbm_bytes, x.held * hw.hbm_bytes_per_s))}};
    // What the pool produced per node-second it held, as published per-node figures count:
    // prefill, the completed requests' prompt tokens (cached ones included); decode, their
    // output tokens.
    auto node_s = x.held / gpus_per_node;
    if (p.role == pool_role::prefill)
      j["input_tokens_per_node_s"] = tidy(ratio(static_cast<double>(in_tokens), node_s));
    if (p.role == pool_role::decode) {
      j["output_tokens_per_node_s"] = tidy(ratio(static_cast<double>(out_tokens), node_s));
      j["decode_steps"] = x.decode_steps;
      j["sequences_per_step"] = tidy(ratio(x.sequences, static_cast<double>(x.decode_steps)));
      j["batch_occupancy"] = tidy(ratio(x.sequences, x.capacity));
      j["kv_occupancy"] = tidy(ratio(x.kv, x.kv_capacity));
      j["kv_occupancy_peak"] = tidy(x.kv_peak);
    }
    per_pool[p.name] = std::move(j);
  }
  return {{"total", initial},
          {"gpu_hours_held", tidy(all.held / 3600)},
          {"busy_share", tidy(ratio(all.busy, all.held))},
          {"input_tokens_per_gpu_s", tidy(ratio(static_cast<double>(in_tokens), all.held))},
          {"output_tokens_per_gpu_s", tidy(ratio(static_cast<double>(out_tokens), all.held))},
          {"output_tokens_per_gpu_hour",
           tidy(ratio(static_cast<double>(out_tokens), all.held / 3600))},
          {"pools", std::move(per_pool)},
          {"instance_busy_share", std::move(per_instance)},
          {"instance_up_s", std::move(per_instance_up)}};
}

/// The performance model's options for an EP group of `ep` ranks under the run's expert load
/// (sim_params::expert_skew, eplb) and structured output's masks and compiles
/// (structured_mask_s, structured_compile_s).
perf_options perf_for(const model_profile& model, std::uint32_t ep, double expert_skew,
                      bool eplb, double mask_s, double compile_s) {
  perf_options opt;
  if (expert_skew > 0.0)
    opt.moe_balance = expert_balance(model, ep, expert_skew, eplb);
  opt.mask_s = mask_s;
  opt.compile_s = compile_s;
  return opt;
}

perf_options perf_for(const model_profile& model, std::uint32_t ep, const sim_params& p) {
  return perf_for(model, ep, p.expert_skew, p.eplb, p.structured_mask_s, p.structured_compile_s);
}

/// The autoscaler's parameters from the topology. Per-instance capacities come from the
/// performance model: a prefill instance computes `step_tokens` cache-missed tokens per full
/// chunked-prefill step, a decode instance holds `max_batch` requests in compute.
actors::autoscaler_params autoscaler_params_for(
  const topology& topo, const pool_spec& prefill, const pool_spec& decode, const pool_spec* vision,
  const model_profile& model, const hardware_profile& hw, const perf_options& prefill_opt,
  const actors::prefill_engine_params& pe,
  const actors::decode_engine_params& de,
  std::function<runtime::child_spec(actors::instance_id)> make_prefill,
  std::function<runtime::child_spec(actors::instance_id)> make_decode, caf::actor cluster,
  actors::prefill_lb_actor prefill_lb, actors::decode_lb_actor decode_lb,
  std::shared_ptr<actors::autoscaler_log> log) {
  const auto& a = topo.autoscaler;
  actors::autoscaler_params ap;
  ap.interval = a.interval;
  ap.limits = scale_limits_of(a);
  ap.join = a.inventory_join;
  ap.refill = a.inventory_refill;
  ap.root = std::move(cluster);
  ap.prefill_lb = std::move(prefill_lb);
  ap.decode_lb = std::move(decode_lb);
  auto ranks = prefill.gpus_per_instance;
  auto per_gpu = make_step_cost(model, hw, prefill.ep_size, prefill_opt);
  runtime::device_step step;
  step.phase = runtime::step_phase::prefill;
  step.tokens = (pe.step_tokens + ranks - 1) / ranks;
  step.sequences = 1;
  step.context_tokens = step.tokens;
  auto step_s = std::max(1e-9, runtime::to_seconds(per_gpu(step)));
  ap.prefill = autoscaled_pool_of(prefill, static_cast<double>(pe.step_tokens) / step_s,
                                  std::move(make_prefill));
  ap.decode = autoscaled_pool_of(decode, static_cast<double>(de.max_batch), std::move(make_decode));
  ap.fixed_gpus = vision != nullptr ? vision->gpus(vision->instances.initial) : 0;
  ap.log = std::move(log);
  return ap;
}

/// `report.autoscaler`: every decision with its inputs, and every scale event.
nlohmann::json autoscaler_json(const actors::autoscaler_log& log, runtime::time_point origin) {
  auto secs = [&](runtime::time_point t) { return tidy(runtime::to_seconds(t - origin)); };
  nlohmann::json decisions = nlohmann::json::array();
  for (auto& r : log.decisions) {
    nlohmann::json pools = nlohmann::json::object();
    for (std::size_t k = 0; k < r.inputs.pools.size(); ++k) {
      auto& i = r.inputs.pools[k];
      auto& d = r.decision.pools[k];
      pools[i.pool] = {{"demand", tidy(i.demand)},     {"capacity", tidy(i.capacity)},
                       {"online", i.online},           {"starting", i.starting},
                       {"draining", i.draining},       {"instances_down", i.down},
                       {"min", i.min},
                       {"max", i.max},                 {"need", d.need},
                       {"desired", d.desired},         {"current", d.current},
                       {"target", d.target},           {"up", d.up},
                       {"from_inventory", d.from_inventory}, {"down", d.down},
                       {"reason", d.reason}};
    }
    decisions.push_back({{"t_s", secs(r.at)},
                         {"occupancy", tidy(r.decision.occupancy)},
                         {"gpus_held", r.inputs.gpus_held},
                         {"inventory_ready", r.inputs.inventory_ready},
                         {"inventory_refilling", r.inputs.inventory_refilling},
                         {"refill", r.decision.refill},
                         {"pools", std::move(pools)}});
  }
  nlohmann::json events = nlohmann::json::array();
  for (auto& e : log.events) {
    nlohmann::json j = {{"t_s", secs(e.at)}, {"pool", e.pool}, {"kind", e.kind}};
    if (e.pool != "inventory")
      j["instance"] = e.instance;
    if (!e.detail.empty())
      j["detail"] = e.detail;
    events.push_back(std::move(j));
  }
  return {{"decisions", std::move(decisions)}, {"events", std::move(events)}};
}

} // namespace

namespace {
result<sim_outcome> simulate(const topology& topo, record_stream next_record, std::uint64_t total,
                             std::optional<std::uint64_t> all_chain_blocks,
                             const sim_options& options);
} // namespace

result<sim_outcome> run_simulation(const topology& topo, const std::vector<request_record>& records,
                                   const sim_options& options) {
  // The hit rate's denominator covers every record, admitted or not (as make_chain counts).
  std::uint64_t all_chain_blocks = 0;
  for (auto& r : records)
    all_chain_blocks += std::min<std::uint64_t>(r.blocks.size(), r.input_tokens / actors::block_tokens);
  std::size_t i = 0;
  record_stream next = [&records, &i]() -> std::optional<request_record> {
    if (i >= records.size())
      return std::nullopt;
    return records[i++];
  };
  return simulate(topo, std::move(next), records.size(), all_chain_blocks, options);
}

result<sim_outcome> run_simulation(const topology& topo, record_stream next, std::uint64_t total,
                                   const sim_options& options) {
  return simulate(topo, std::move(next), total, std::nullopt, options);
}

namespace {

/// Both forms: `all_chain_blocks` is the hit rate's denominator when known up front; without
/// it, the chains of the records pulled so far count.
result<sim_outcome> simulate(const topology& topo, record_stream next_record, std::uint64_t total,
                             std::optional<std::uint64_t> all_chain_blocks,
                             const sim_options& options) {
  auto wall_start = std::chrono::steady_clock::now();
  auto model = resolve_model(topo.cluster.model, default_models_dir());
  if (!model)
    return result<sim_outcome>::failure(model.error());
  auto hw = resolve_hardware(topo.cluster.hardware);
  if (!hw)
    return result<sim_outcome>::failure(hw.error());
  auto* prefill_pool = find_pool(topo, pool_role::prefill);
  auto* decode_pool = find_pool(topo, pool_role::decode);
  auto* vision_pool = find_pool(topo, pool_role::vision);
  if (prefill_pool == nullptr || decode_pool == nullptr)
    return result<sim_outcome>::failure("the topology needs a prefill and a decode pool");
  // An instance that cannot start (its EP group cannot form, its weights do not fit) fails
  // the run up front, not its requests one by one.
  // Instances that cannot hold the model's weights run, with a warning in the report.
  std::vector<std::string> warnings;
  {
    std::string fatal;
    for (auto& q : check_capacity(topo, *model, *hw)) {
      auto what = "pool " + q.pool + ": " + q.message;
      if (q.fatal)
        fatal += (fatal.empty() ? "" : "; ") + what;
      else
        warnings.push_back(what + "; the simulation runs it anyway"
                           + (q.pool == decode_pool->name
                                ? ", with a KV capacity of " + std::to_string(fallback_kv_tokens)
                                    + " tokens"
                                : std::string{}));
    }
    if (!fatal.empty())
      return result<sim_outcome>::failure(fatal);
  }
  const auto& p = options.params;

  runtime::world w{runtime::world_options{runtime::world_mode::sim, options.seed, 0, false,
                                          actors::register_actor_types}};
  auto& sys = w.system();
  auto origin = w.now();
  auto kv_bytes_per_token = static_cast<std::uint64_t>(std::llround(model->kv_bytes_per_token));

  // Control: the KV CHECK role and the balancers.
  actors::kv_index_params kv;
  kv.capacity_bytes = topo.storage.capacity_bytes / std::max<std::uint32_t>(1, p.kv_shards);
  kv.block_bytes = static_cast<std::uint64_t>(std::llround(model->kv_bytes_per_block()));
  auto storage_ttl = topo.storage.ttl;
  for (auto& [cls, ttl] : p.kv_ttl)
    storage_ttl[cls] = ttl;
  if (auto i = storage_ttl.find("chatbot"); i != storage_ttl.end())
    kv.ttl.chatbot = i->second;
  if (auto i = storage_ttl.find("agent"); i != storage_ttl.end())
    kv.ttl.agent = i->second;
  // The run's history, when it is checked (history_checker.hpp).
  auto history = options.check_history ? std::make_shared<actors::run_history>() : nullptr;
  kv.history = history;
  kv.op_latency = p.kv_store_latency;
  kv.test_ignore_expiry = p.test_kv_ignore_expiry;
  auto kv_store = actors::spawn_sharded_kv_store(sys, kv, std::max<std::uint32_t>(1, p.kv_shards),
                                                 topo.storage.real_replicas());
  actors::prefill_lb_params plb;
  plb.balancer.bucket_bounds = prefill_pool->buckets;
  plb.rebalance_interval = p.rebalance_interval;
  auto prefill_lb = actors::spawn_prefill_lb(sys, plb);
  actors::decode_balancer_params dlb;
  dlb.long_threshold = p.decode_long_threshold;
  dlb.long_share = p.decode_long_share;
  dlb.waiting_window = 2 * p.retry_interval;
  dlb.max_requests = p.decode_requests_per_gpu * decode_pool->gpus_per_instance;
  // The KV a decode instance holds: its HBM left after weights and workspace (capacity.hpp).
  dlb.max_kv_tokens
    = p.decode_kv_tokens > 0
        ? p.decode_kv_tokens
        : kv_capacity_tokens(*model, *hw, decode_pool->gpus_per_instance, decode_pool->ep_size);
  auto decode_lb = actors::spawn_decode_lb(sys, dlb, history);
  actors::vision_lb_actor vision_lb;
  if (vision_pool != nullptr)
    vision_lb = actors::spawn_vision_lb(sys);

  // Pools: a supervisor each, instances as its children.
  auto busy = std::make_shared<busy_table>();
  busy->clock = &w;
  busy->origin = origin;
  for (auto* pool : {prefill_pool, decode_pool})
    for (std::uint32_t i = 0; i < pool->instances.initial; ++i)
      busy->by_key[pool->name + "/" + std::to_string(i)];
  auto fleet = std::make_shared<fleet_state>();
  // KV links get a fault-aware wrapper only when the plan can cut or slow one, so other runs
  // have the same events as without it.
  const bool link_faults
    = std::any_of(options.faults.begin(), options.faults.end(), [](const fault& f) {
        return f.kind == fault_kind::partition
               || (f.kind == fault_kind::slow && f.target.kind == target_kind::link);
      });
  fleet->clock = &w;
  fleet->origin = origin;
  // The routed experts' load and placement per pool, when the load is skewed.
  std::map<std::string, std::shared_ptr<pool_experts>> experts_of;
  if (p.expert_skew > 0.0)
    for (const auto* pool : {prefill_pool, decode_pool}) {
      auto e = std::make_shared<pool_experts>();
      e->model = *model;
      e->skew = p.expert_skew;
      e->drift = p.expert_drift;
      e->origin = origin;
      experts_of[pool->name] = e;
    }
  auto ports_for = [&](const pool_spec& pool, double link_bw, runtime::duration link_lat) {
    actors::instance_ports ports;
    auto m = *model;
    auto pool_load = experts_of.count(pool.name) > 0 ? experts_of.at(pool.name) : nullptr;
    auto h = *hw;
    auto configured = pool.gpus_per_instance;
    auto pool_ep = pool.ep_size;
    auto name = pool.name;
    auto per_gpu_batch = pool.role == pool_role::decode ? p.decode_requests_per_gpu : 0;
    ports.device = [m, h, configured, pool_ep, busy, name, fleet, per_gpu_batch, drafts = p.drafts,
                    kv_tokens = p.decode_kv_tokens, history, skew = p.expert_skew,
                    eplb = p.eplb, mask_s = p.structured_mask_s,
                    compile_s = p.structured_compile_s, experts = pool_load](
                     caf::local_actor* self, actors::instance_id id, std::uint32_t rank,
                     std::uint32_t size) {
      // Only the leader rank is sent steps (its cost covers the EP group); the EP size
      // shrinks with the incarnation (docs/faults.md, "EP resize on restart"), and with it
      // the batch it decodes and the KV its memory holds.
      auto key = name + "/" + std::to_string(id);
      auto ep = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(
                                             std::uint64_t{pool_ep} * size / configured));
      auto kv_capacity = per_gpu_batch == 0 ? 0
                         : kv_tokens > 0  ? kv_tokens
                                          : kv_capacity_tokens(m, h, size, ep);
      auto device = runtime::spawn_sim_device(
        self->system(), instance_cost(m, h, ep, perf_for(m, ep, skew, eplb, mask_s, compile_s), size, busy, key, fleet,
                                      std::uint64_t{per_gpu_batch} * size, kv_capacity, experts),
        drafts);
      // The GPU is held from now until its device exits (docs/report.md, "gpus").
      auto index = busy->devices.size();
      busy->devices.push_back({key, rank == 0, busy->clock->now(), std::nullopt});
      // The history's incarnations: the leader's device up and down.
      const bool leader = rank == 0 && history != nullptr;
      if (leader)
        history->add(actors::instance_fact{busy->clock->now(), key, true});
      caf::actor_cast<caf::abstract_actor*>(device)->attach_functor([busy, index, leader, history,
                                                                     key] {
        // After the report (clock cleared) the world is shutting down: nothing to record.
        if (busy->clock == nullptr)
          return;
        busy->devices[index].end = busy->clock->now();
        if (leader)
          history->add(actors::instance_fact{busy->clock->now(), key, false});
      });
      return device;
    };
    auto experts = m.routed_experts;
    ports.gpus = [configured, experts, name, fleet](actors::instance_id id) {
      return incarnation_gpus(*fleet, name + "/" + std::to_string(id), configured, experts);
    };
    ports.link = [link_bw, link_lat, link_faults, fleet, name](caf::local_actor* self,
                                                              actors::instance_id id) {
      auto link = runtime::spawn_sim_link(self->system(), runtime::sim_link_params{link_bw, link_lat});
      if (!link_faults)
        return link;
      return spawn_faulty_link(self->system(), link, link_bw, fleet,
                               name + "/" + std::to_string(id));
    };
    return ports;
  };
  runtime::supervisor_flags pool_flags{runtime::strategy::one_for_one, 1000, 1h, p.restart_time,
                                       1.0, p.restart_time};
  runtime::supervisor_config prefill_cfg{prefill_pool->name, pool_flags, {}};
  actors::prefill_engine_params pe;
  pe.step_tokens = p.prefill_tokens_per_gpu * prefill_pool->gpus_per_instance;
  pe.fetch_layers = static_cast<std::uint32_t>(model->layers.size());
  if (p.exact_rebuild)
    pe.exact_rebuild_layers = static_cast<std::uint32_t>(model->layers.size());
  // Tokens the prefill instances computed: uncached parts and window-state rebuilds.
  auto prefill_computed = std::make_shared<std::pair<std::uint64_t, std::uint64_t>>();
  pe.on_job = [prefill_computed](std::uint64_t tokens) {
    ++prefill_computed->first;
    prefill_computed->second += tokens;
  };
  auto make_prefill = [name = prefill_pool->name, ranks = prefill_pool->gpus_per_instance, pe,
                       ports = ports_for(*prefill_pool, p.fetch_bandwidth, p.fetch_latency),
                       prefill_lb](actors::instance_id i) {
    return actors::prefill_instance(name, i, ranks, pe, ports, prefill_lb);
  };
  for (std::uint32_t i = 0; i < prefill_pool->instances.initial; ++i)
    prefill_cfg.children.push_back(make_prefill(i));
  runtime::supervisor_config decode_cfg{decode_pool->name, pool_flags, {}};
  actors::decode_engine_params de;
  de.max_batch = p.decode_requests_per_gpu * decode_pool->gpus_per_instance;
  de.spec = p.speculation;
  de.fixed_drafts = p.fixed_drafts;
  de.overlap = p.overlap;
  de.prepare_cost = [ranks = decode_pool->gpus_per_instance](const runtime::device_step& s) {
    return runtime::from_seconds(schedule_seconds(gpu_share(s, ranks)));
  };
  // Decode steps, their device time, and the time the devices waited for the scheduler
  // between steps.
  struct schedule_totals {
    std::uint64_t steps = 0;
    runtime::duration busy{0};
    runtime::duration waited{0};
  };
  auto schedule_tally = std::make_shared<schedule_totals>();
  de.on_step = [schedule_tally](runtime::time_point started, runtime::time_point finished,
                                runtime::duration stalled) {
    ++schedule_tally->steps;
    schedule_tally->busy += finished - started;
    schedule_tally->waited += stalled;
  };
  auto spec_tally = std::make_shared<std::array<std::uint64_t, 3>>();
  de.on_verify = [spec_tally](std::uint64_t seqs, std::uint64_t verified, std::uint64_t accepted) {
    (*spec_tally)[0] += seqs;
    (*spec_tally)[1] += verified;
    (*spec_tally)[2] += accepted;
  };
  if (p.speculation == actors::speculation::dspark) {
    // DSpark's cost curve: the step time of the pool's configured instance, per GPU share as
    // instance_cost divides it (without its bookkeeping; a slowdown scales every choice alike).
    auto per_gpu = make_step_cost(*model, *hw, decode_pool->ep_size,
                                  perf_for(*model, decode_pool->ep_size, p));
    de.step_cost = [per_gpu, ranks = decode_pool->gpus_per_instance](const runtime::device_step& s) {
      return per_gpu(gpu_share(s, ranks));
    };
  }
  // Blocks the decode instances' writers made visible in the store (one thread in the sim).
  auto persisted = std::make_shared<std::uint64_t>(0);
  actors::block_writer_params writer;
  writer.kv = kv_store;
  writer.on_persisted = [persisted](std::uint64_t n) { *persisted += n; };
  auto make_decode = [name = decode_pool->name, ranks = decode_pool->gpus_per_instance, de,
                      ports = ports_for(*decode_pool, p.handoff_bandwidth, p.handoff_latency),
                      decode_lb, writer](actors::instance_id i) {
    return actors::decode_instance(name, i, ranks, de, ports, decode_lb, writer);
  };
  for (std::uint32_t i = 0; i < decode_pool->instances.initial; ++i)
    decode_cfg.children.push_back(make_decode(i));
  std::vector<runtime::child_spec> pools{runtime::supervisor_child(std::move(prefill_cfg)),
                                         runtime::supervisor_child(std::move(decode_cfg))};
  if (vision_pool != nullptr) {
    runtime::supervisor_config vision_cfg{vision_pool->name, pool_flags, {}};
    actors::vision_engine_params ve;
    ve.step_images = p.vision_images_per_gpu * vision_pool->gpus_per_instance;
    for (std::uint32_t i = 0; i < vision_pool->instances.initial; ++i)
      vision_cfg.children.push_back(actors::vision_instance(
        vision_pool->name, i, vision_pool->gpus_per_instance, ve,
        ports_for(*vision_pool, 0, 0s), vision_lb));
    pools.push_back(runtime::supervisor_child(std::move(vision_cfg)));
  }
  // EPLB: an expert balancer per pool re-places the experts by their recent load.
  std::vector<actors::expert_balancer_actor> expert_balancers;
  if (p.eplb)
    for (const auto& [name, experts] : experts_of) {
      const auto* pool = name == prefill_pool->name ? prefill_pool : decode_pool;
      actors::expert_balancer_params eb;
      eb.ranks = std::max<std::uint32_t>(1, pool->ep_size);
      eb.slots_per_rank = eplb_slots_per_rank(*model, eb.ranks);
      eb.interval = p.eplb_interval;
      eb.window = p.eplb_interval > runtime::duration{0} ? p.eplb_interval : std::chrono::minutes(5);
      eb.load_time = p.eplb_load_time;
      eb.load = [experts = experts](runtime::time_point from, runtime::time_point to) {
        return experts->load_over(from, to);
      };
      eb.publish = [experts = experts](const std::vector<double>& load,
                                       const actors::expert_placement&) {
        experts->publish(load);
      };
      expert_balancers.push_back(actors::spawn_expert_balancer(sys, std::move(eb)));
    }
  auto cluster = runtime::spawn_supervisor(
    sys, {topo.cluster.name, {runtime::strategy::one_for_one, 10, 1h}, std::move(pools)});
  w.driver().run_for(0s);

  // The autoscaler (actors/autoscaler), when the topology enables it.
  std::shared_ptr<actors::autoscaler_log> scale_log;
  caf::actor autoscaler;
  if (topo.autoscaler.enabled) {
    scale_log = std::make_shared<actors::autoscaler_log>();
    auto ap = autoscaler_params_for(topo, *prefill_pool, *decode_pool, vision_pool, *model, *hw,
                                    perf_for(*model, prefill_pool->ep_size, p),
                                    pe, de, make_prefill, make_decode, cluster, prefill_lb,
                                    decode_lb, scale_log);
    ap.test_order_one_more = p.test_autoscaler_order_one_more;
    autoscaler = actors::spawn_autoscaler(sys, std::move(ap));
  }

  // Faults (docs/faults.md, "What is injected"): the plan's orders for the fault injector,
  // with their effects on the fleet's bookkeeping (fault_injection.hpp).
  auto injected_log = std::make_shared<std::vector<actors::fault_record>>();
  std::vector<std::size_t> order_of_fault(options.faults.size(), SIZE_MAX);
  caf::actor injector;
  {
    auto planned = plan_fault_orders(topo, options.faults, w.now() - origin, fleet, kv_store,
                                     prefill_pool->name, decode_pool->name);
    order_of_fault = std::move(planned.order_of_fault);
    auto& orders = planned.orders;
    if (!orders.empty())
      injector = actors::spawn_fault_injector(sys, cluster, std::move(orders), injected_log);
  }

  // The workload, as request specs made as the source pulls them.
  auto chain_blocks = std::make_shared<std::uint64_t>(0);
  auto next_id = std::make_shared<std::uint64_t>(0);
  // Surges (fault kind `surge`) speed the workload's clock up by their factor while they last.
  surge_clock surges{options.faults, w.now() - origin};
  const auto structured = runtime::rng{options.seed}.split("structured");
  auto constrained = std::make_shared<std::uint64_t>(0);
  admission_stream workload = [next_record = std::move(next_record), chain_blocks, next_id,
                               image_tokens = p.image_tokens, share = p.structured_share,
                               structured, constrained, surges]() -> std::optional<admission> {
    auto r = next_record();
    if (!r)
      return std::nullopt;
    r->arrival = surges.arrival(r->arrival);
    actors::request_spec spec;
    spec.id = ++*next_id;
    spec.input_tokens = r->input_tokens;
    spec.output_tokens = r->output_tokens;
    spec.chain = actors::make_chain(std::span<const std::uint64_t>{r->blocks}, r->input_tokens);
    spec.traffic = r->traffic == traffic_class::agent ? schemas::traffic_class::agent
                                                      : schemas::traffic_class::chatbot;
    spec.images = r->images;
    spec.image_tokens = r->images * image_tokens;
    if (share > 0 && structured.split("request", spec.id).chance(share)) {
      spec.constraint.format = "simulated";  // costed by its masks; no grammar in this world
      ++*constrained;
    }
    *chain_blocks += spec.chain.size();
    return admission{r->arrival, std::move(spec)};
  };
  auto log = std::make_shared<source_log>();
  // One outcome and one admitted id per record: reserved (up to 16 M), so the vectors do not
  // double through a copy (an hour at 200/s is 720 k outcomes of ~190 bytes); pages not
  // reached stay unmapped.
  const auto expected = static_cast<std::size_t>(std::min<std::uint64_t>(total, 1u << 24));
  log->outcomes.reserve(expected);
  log->admitted_ids.reserve(expected);
  actors::request_services services{kv_store, prefill_lb, decode_lb, kv_bytes_per_token, {},
                                    vision_lb};
  services.deadline = p.request_deadline;
  services.max_reroutes = p.max_reroutes;
  services.retry_interval = p.retry_interval;
  services.progress_every = p.progress_every;
  services.test_drop_on_reroute = p.test_drop_on_reroute;
  services.test_replay_on_reroute = p.test_replay_on_reroute;
  services.swa_ring_bytes = static_cast<std::uint64_t>(std::llround(model->swa_ring_bytes()));
  services.history = history;
  services.stream_kv = p.stream_kv;
  auto source = spawn_trace_source(sys, std::move(workload), services, log);

  // Drive the virtual clock in slices until every request has ended.
  auto& driver = w.driver();
  driver.set_profiling(options.profile);
  auto report_progress = [&] {
    if (options.progress)
      options.progress(sim_progress_info{runtime::to_seconds(w.now() - origin), driver.events(),
                                         log->admitted, log->outcomes.size(), total});
  };
  bool finished = false;
  for (;;) {
    auto next = w.now() + options.progress_every;
    if (options.until && next > origin + *options.until)
      next = origin + *options.until;
    driver.run_until(next);
    report_progress();
    if (!busy->internal_failure.empty())
      break;
    if (log->outcomes.size() == total) {
      finished = true;
      break;
    }
    if (options.until && w.now() >= origin + *options.until)
      break;
  }
  // A finished run ends with its last request (not at the end of the last slice).
  auto end = w.now();
  if (finished) {
    end = origin;
    for (auto& o : log->outcomes)
      end = std::max(end, o.finished);
  }
  auto events = driver.events();
  if (!busy->internal_failure.empty()) {
    busy->clock = nullptr;
    return result<sim_outcome>::failure("internal failure: " + busy->internal_failure);
  }

  // Final counters from the control actors (asked after the clock stopped: no time passes).
  auto prefill_stats = ask<actors::lb_counters>(sys, prefill_lb, actors::lb_stats_atom::value);
  auto decode_stats = ask<actors::lb_counters>(sys, decode_lb, actors::lb_stats_atom::value);
  auto kv_stats = ask<actors::kv_stats>(sys, kv_store, actors::kv_stats_atom::value);
  auto vision_stats = std::make_shared<std::optional<actors::lb_counters>>();
  if (vision_lb)
    vision_stats = ask<actors::lb_counters>(sys, vision_lb, actors::lb_stats_atom::value);
  driver.run_until(w.now());

  // The report: only what the run itself determines.
  auto& outcomes = log->outcomes;
  std::sort(outcomes.begin(), outcomes.end(),
            [](auto& a, auto& b) { return a.id < b.id; });
  std::vector<double> ttft, tbt, e2e, e2e_rerouted;
  std::uint64_t completed = 0, failed = 0, in_tokens = 0, out_tokens = 0, hit_blocks = 0,
                hit_tokens = 0, prompt_tokens = 0;
  std::map<std::string, std::uint64_t> failures;
  std::uint64_t rerouted = 0, reroutes = 0, forwarded = 0, forwards = 0;
  runtime::time_point last = origin;
  for (auto& o : outcomes) {
    rerouted += o.reroutes > 0 ? 1 : 0;
    reroutes += o.reroutes;
    forwarded += o.forwards > 0 ? 1 : 0;
    forwards += o.forwards;
    prompt_tokens += o.input_tokens;
    hit_blocks += o.hit_blocks;
    hit_tokens += o.hit_tokens;
    if (!o.completed) {
      ++failed;
      ++failures[o.failure];
      continue;
    }
    ++completed;
    in_tokens += o.input_tokens;
    out_tokens += o.output_tokens;
    last = std::max(last, o.finished);
    ttft.push_back(runtime::to_seconds(o.first_token - o.admitted) * 1e3);
    e2e.push_back(runtime::to_seconds(o.finished - o.admitted) * 1e3);
    if (o.reroutes > 0 || o.forwards > 0)
      e2e_rerouted.push_back(e2e.back());
    if (o.output_tokens > 1)
      tbt.push_back(runtime::to_seconds(o.finished - o.first_token) * 1e3
                    / static_cast<double>(o.output_tokens - 1));
  }
  auto blocks_asked = all_chain_blocks.value_or(*chain_blocks);
  auto virtual_s = runtime::to_seconds(end - origin);
  auto span_s = std::max(1e-9, runtime::to_seconds(last - origin));
  nlohmann::json report;
  report["topology"] = topo.cluster.name;
  report["model"] = model->name;
  report["hardware"] = hw->name;
  report["seed"] = options.seed;
  if (!warnings.empty())
    report["warnings"] = warnings;
  report["requests"] = {{"total", total},
                        {"admitted", log->admitted},
                        {"completed", completed},
                        {"failed", failed},
                        {"unfinished", log->admitted - outcomes.size()},
                        {"rerouted", rerouted},
                        {"reroutes", reroutes},
                        {"forwarded", forwarded},
                        {"forwards", forwards}};
  if (!failures.empty())
    report["requests"]["failures"] = failures;
  auto tidy_all = [](nlohmann::json j) {
    for (auto& [k, v] : j.items())
      v = tidy(v.get<double>());
    return j;
  };
  report["latency_ms"] = {{"ttft", tidy_all(percentiles(ttft))},
                          {"tbt", tidy_all(percentiles(tbt))},
                          {"e2e", tidy_all(percentiles(e2e))}};
  // The requests a fault touched (rerouted or forwarded, completed): what they paid.
  if (!e2e_rerouted.empty())
    report["latency_ms"]["e2e_rerouted"] = tidy_all(percentiles(e2e_rerouted));
  report["throughput"] = {{"input_tokens_per_s", tidy(static_cast<double>(in_tokens) / span_s)},
                          {"output_tokens_per_s", tidy(static_cast<double>(out_tokens) / span_s)}};
  std::vector<std::string> memory_violations;
  report["kv"] = {
    {"block_hit_rate",
     tidy(blocks_asked > 0 ? static_cast<double>(hit_blocks) / static_cast<double>(blocks_asked)
                           : 0)},
    {"token_hit_rate",
     tidy(prompt_tokens > 0 ? static_cast<double>(hit_tokens) / static_cast<double>(prompt_tokens)
                            : 0)},
    {"persisted_blocks", *persisted}};
  if (*kv_stats)
    report["kv"]["store"] = {{"entries", (*kv_stats)->entries},
                             {"bytes", (*kv_stats)->bytes},
                             {"evictions", (*kv_stats)->evictions},
                             {"expirations", (*kv_stats)->expirations},
                             {"served_expired", (*kv_stats)->served_expired}};
  for (auto* s : {prefill_stats.get(), decode_stats.get(), vision_stats.get()})
    if (*s)
      for (std::size_t i = 0; i < (*s)->names.size(); ++i)
        report["lb"][(*s)->lb][(*s)->names[i]] = (*s)->values[i];
  report["gpus"] = gpu_figures(*busy, topo, end, in_tokens, out_tokens, *hw);
  busy->clock = nullptr; // the devices that exit from now on are past the report
  for (auto& v : busy->memory_violations)
    memory_violations.push_back(v);
  if (busy->memory_violation_count > busy->memory_violations.size())
    memory_violations.push_back(fmt::format(
      "{} more decode steps held more KV than their instance's memory",
      busy->memory_violation_count - busy->memory_violations.size()));
  if (p.speculation != actors::speculation::off) {
    const auto [seqs, verified, accepted] = *spec_tally;
    auto ratio = [](std::uint64_t a, std::uint64_t b) {
      return b == 0 ? 0.0 : tidy(static_cast<double>(a) / static_cast<double>(b));
    };
    report["speculation"] = {{"mode", actors::to_string(p.speculation)},
                             {"verifying_sequence_steps", seqs},
                             {"drafts_verified", verified},
                             {"drafts_accepted", accepted},
                             {"acceptance", ratio(accepted, verified)},
                             {"drafts_per_verify", ratio(verified, seqs)},
                             {"tokens_per_verify", tidy(1.0 + ratio(accepted, seqs))}};
  }
  if (p.structured_share > 0)
    report["structured"] = {{"share", tidy(p.structured_share)},
                            {"requests", *constrained},
                            {"mask_s", tidy(p.structured_mask_s)},
                            {"compile_s", tidy(p.structured_compile_s)}};
  {
    double device_s = 0;
    for (const auto& [key, in] : busy->by_key)
      if (key.rfind(prefill_pool->name + "/", 0) == 0)
        device_s += in.seconds;
    report["prefill"] = {{"rebuild", p.exact_rebuild ? "exact" : "bounded"},
                         {"jobs", prefill_computed->first},
                         {"computed_tokens", prefill_computed->second},
                         {"device_s", tidy(device_s)}};
  }
  {
    // The share of the decode devices' time (steps + waits between them) spent waiting.
    const double waited = runtime::to_seconds(schedule_tally->waited);
    const double total = runtime::to_seconds(schedule_tally->busy) + waited;
    report["scheduling"] = {{"overlap", p.overlap},
                            {"decode_steps", schedule_tally->steps},
                            {"scheduler_wait_s", tidy(waited)},
                            {"wait_share", total > 0 ? tidy(waited / total) : 0.0}};
  }
  if (p.expert_skew > 0.0) {
    auto balance = [&](const pool_spec* pool, bool eplb) {
      return tidy(expert_balance(*model, pool->ep_size, p.expert_skew, eplb));
    };
    auto mean = [&](const pool_spec* pool) {
      const auto& e = *experts_of.at(pool->name);
      return tidy(e.seconds > 0 ? e.weighted / e.seconds : 1.0);
    };
    report["experts"] = {{"skew", p.expert_skew},
                         {"eplb", p.eplb},
                         {"drift_s", tidy(runtime::to_seconds(p.expert_drift))},
                         {"eplb_interval_s", tidy(runtime::to_seconds(p.eplb_interval))},
                         {"placements_published", experts_of.at(decode_pool->name)->published},
                         {"prefill_balancedness_mean", mean(prefill_pool)},
                         {"decode_balancedness_mean", mean(decode_pool)},
                         {"prefill_balancedness", balance(prefill_pool, p.eplb)},
                         {"decode_balancedness", balance(decode_pool, p.eplb)},
                         {"decode_balancedness_contiguous", balance(decode_pool, false)},
                         {"decode_balancedness_eplb", balance(decode_pool, true)}};
  }
  report["sim"] = {{"virtual_s", tidy(virtual_s)}, {"events", events}};
  if (!options.faults.empty()) {
    // Every fault of the timeline, marked injected or not (and why not).
    auto timeline = to_json(options.faults);
    std::map<std::size_t, const actors::fault_record*> done;
    for (auto& r : *injected_log)
      done[r.order] = &r;
    std::uint64_t injected = 0;
    std::set<std::string> not_yet;
    for (std::size_t i = 0; i < options.faults.size(); ++i) {
      auto& entry = timeline[i];
      auto o = order_of_fault[i];
      if (options.faults[i].kind == fault_kind::surge) {
        // Applied at admission (surge.hpp): injected when it began before the run ended.
        entry["injected"] = options.faults[i].at <= end - origin;
        if (options.faults[i].at <= end - origin)
          ++injected;
        else
          entry["skipped"] = "after the end of the run";
      } else if (o == SIZE_MAX) {
        auto kind = std::string{to_string(options.faults[i].kind)};
        if (options.faults[i].kind == fault_kind::fail)
          kind += " of a " + std::string{to_string(options.faults[i].target.kind)};
        not_yet.insert(kind);
        entry["injected"] = false;
        entry["skipped"] = "not injected yet: " + kind;
      } else if (auto d = done.find(o); d == done.end()) {
        entry["injected"] = false;
        entry["skipped"] = "after the end of the run";
      } else {
        entry["injected"] = d->second->injected;
        if (d->second->injected)
          ++injected;
        else
          entry["skipped"] = d->second->skipped;
        // A gpu fault that found no rank to stop (its instance down, or the GPU outside the
        // re-formed group) still marked the GPU failed.
        if (!d->second->injected && options.faults[i].kind == fault_kind::fail
            && options.faults[i].target.kind == target_kind::gpu)
          entry["gpu_marked_failed"] = true;
        if (d->second->forwarded && d->second->forwarded->done)
          entry["forwarded"] = d->second->forwarded->forwarded;
      }
    }
    report["faults"] = {{"injected", injected > 0},
                        {"injected_count", injected},
                        {"injects", "fail of a gpu, an instance, a pool or a node (an instance restarts "
                                    "after sim_params.restart_time on its healthy GPUs, EP rounded "
                                    "down to a valid size, or stays down); recover of a gpu or a node; slow of "
                                    "a gpu, an instance, a pool, a node or a link; partition of a link, an "
                                    "instance, a pool or a node (its KV transfers wait for the cut to heal); store_fail, "
                                    "store_slow and recover of a shard; drain of a decode instance (grace, then its requests are "
                                    "forwarded with their KV and SWA rings and it is removed) or of "
                                    "a prefill instance (finishes its work and is removed); surge (the workload's clock "
                                    "runs factor times faster while it lasts)"},
                        {"not_injected_yet", std::vector<std::string>(not_yet.begin(), not_yet.end())},
                        {"timeline", std::move(timeline)}};
  }
  // The run's timeline (docs/report.md): injected faults, then what the cluster did about
  // them (restarts, EP resizes, instances staying down, recoveries, drain hand-offs), by time.
  {
    nlohmann::json timeline = nlohmann::json::array();
    std::map<std::size_t, const actors::fault_record*> by_order;
    for (auto& r : *injected_log)
      by_order[r.order] = &r;
    for (std::size_t i = 0; i < options.faults.size(); ++i) {
      auto o = order_of_fault[i];
      auto d = o == SIZE_MAX ? by_order.end() : by_order.find(o);
      if (d == by_order.end() || !d->second->injected)
        continue;
      auto& f = options.faults[i];
      nlohmann::json e{{"at_s", tidy(runtime::to_seconds(d->second->at - origin))},
                       {"kind", std::string{to_string(f.kind)}},
                       {"target", to_string(f.target)},
                       {"line", f.line}};
      if (f.kind == fault_kind::slow)
        e["factor"] = f.factor;
      timeline.push_back(std::move(e));
      if (auto& h = d->second->forwarded; h && h->done)
        timeline.push_back({{"at_s", tidy(runtime::to_seconds(h->at - origin))},
                            {"kind", "forward"},
                            {"target", to_string(f.target)},
                            {"forwarded", h->forwarded}});
    }
    for (auto& e : fleet->events)
      timeline.push_back(e);
    std::stable_sort(timeline.begin(), timeline.end(), [](auto& a, auto& b) {
      return a["at_s"].template get<double>() < b["at_s"].template get<double>();
    });
    report["timeline"] = std::move(timeline);
  }
  auto invariants = check_invariants(log->admitted_ids, outcomes, finished);
  // No instance held more KV than its HBM has room for after its weights (busy_table).
  for (auto& v : memory_violations)
    invariants.violations.push_back({0, v, "memory"});
  if (scale_log) {
    report["autoscaler"] = autoscaler_json(*scale_log, origin);
    auto broken = check_autoscaler(*scale_log, scale_limits_of(topo.autoscaler), origin);
    invariants.violations.insert(invariants.violations.end(), broken.begin(), broken.end());
  }
  // No KV block served after its TTL expired: every lookup audits the blocks it serves
  // (kv_index.hpp); any expired one counted there is a violation.
  if (*kv_stats && (*kv_stats)->served_expired > 0)
    invariants.violations.push_back(
      {0,
       fmt::format("{} blocks served as cache hits at or after their TTL expiry",
                   (*kv_stats)->served_expired),
       "kv"});
  // No KV leaked: once every request has ended, no decode instance still holds a request's
  // KV (decode_lb's bookings, released by each request as it leaves an instance) and the
  // store holds no block reserved by a writer and never committed. Reported as request 0.
  if (finished) {
    auto counter = [&](const std::string& lb, const std::string& name) -> std::uint64_t {
      if (!report.contains("lb") || !report["lb"].contains(lb) || !report["lb"][lb].contains(name))
        return 0;
      return report["lb"][lb][name].get<std::uint64_t>();
    };
    const auto held = counter("decode", "held_requests");
    const auto held_kv = counter("decode", "held_kv_tokens");
    if (held > 0 || held_kv > 0)
      invariants.violations.push_back(
        {0, "KV leaked: decode instances still hold " + std::to_string(held) + " requests ("
              + std::to_string(held_kv) + " KV tokens) after every request ended",
         {}});
    if (*kv_stats && (*kv_stats)->pending > 0)
      invariants.violations.push_back(
        {0, "KV leaked: the store holds " + std::to_string((*kv_stats)->pending)
              + " blocks reserved and never committed after every request ended",
         {}});
  }
  // The same promises, recomputed from the run's facts alone (history_checker.hpp).
  std::optional<history_report> history_checked;
  if (history) {
    history_expectations expect;
    expect.origin = origin;
    expect.ttl = ttl_of_classes(storage_ttl);
    expect.decode_kv_tokens = dlb.max_kv_tokens;
    expect.decode_max_requests = dlb.max_requests;
    expect.run_finished = finished;
    expect.restart_time = p.restart_time;
    history_checked = check_history(*history, expect);
    invariants.violations.insert(invariants.violations.end(),
                                 history_checked->violations.begin(),
                                 history_checked->violations.end());
  }
  report["invariants"] = invariants.to_json();
  if (history_checked)
    report["invariants"]["history"] = history_checked->to_json();
  report["series"] = time_series(outcomes, origin, std::max(virtual_s, 1.0), prefill_pool->name,
                                 decode_pool->name, *busy);

  auto wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  nlohmann::json run;
  run["wall_s"] = wall_s;
  run["virtual_s_per_wall_s"] = wall_s > 0 ? virtual_s / wall_s : 0;
  run["events_per_s"] = wall_s > 0 ? static_cast<double>(events) / wall_s : 0;
  run["peak_rss_mib"] = static_cast<double>(peak_rss_kib()) / 1024.0;
  if (options.profile) {
    run["profile"] = nlohmann::json::array();
    for (auto& row : driver.profile())
      run["profile"].push_back({{"actor", row.actor},
                                {"message", row.message},
                                {"count", row.count},
                                {"wall_s", row.wall_s}});
  }
  caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(source, caf::exit_reason::user_shutdown);
  if (injector)
    caf::anon_send_exit(injector, caf::exit_reason::user_shutdown);
  if (autoscaler)
    caf::anon_send_exit(autoscaler, caf::exit_reason::user_shutdown);
  for (auto& b : expert_balancers)
    caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
  return sim_outcome{std::move(report), std::move(run), finished, std::move(invariants)};
}

} // namespace

std::string summarize(const nlohmann::json& r, const nlohmann::json& run) {
  auto num = [](const nlohmann::json& j, int prec = 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", prec, j.get<double>());
    return std::string{buf};
  };
  std::string out;
  out += "troupe sim: " + r["topology"].get<std::string>() + " (" + r["model"].get<std::string>()
         + " on " + r["hardware"].get<std::string>() + "), seed "
         + std::to_string(r["seed"].get<std::uint64_t>()) + "\n";
  auto& q = r["requests"];
  out += "  requests    " + std::to_string(q["admitted"].get<std::uint64_t>()) + " admitted, "
         + std::to_string(q["completed"].get<std::uint64_t>()) + " completed, "
         + std::to_string(q["failed"].get<std::uint64_t>()) + " failed, "
         + std::to_string(q["unfinished"].get<std::uint64_t>()) + " unfinished\n";
  for (auto name : {"ttft", "tbt", "e2e"}) {
    auto& l = r["latency_ms"][name];
    out += std::string{"  "} + name + std::string(12 - std::strlen(name), ' ') + "p50 "
           + num(l["p50"]) + " ms, p90 " + num(l["p90"]) + " ms, p99 " + num(l["p99"]) + " ms\n";
  }
  out += "  throughput  " + num(r["throughput"]["input_tokens_per_s"], 0) + " input tok/s, "
         + num(r["throughput"]["output_tokens_per_s"], 0) + " output tok/s\n";
  if (r.contains("speculation"))
    out += "  speculation " + r["speculation"]["mode"].get<std::string>() + ": "
           + num(r["speculation"]["drafts_per_verify"], 2) + " drafts verified, "
           + num(r["speculation"]["tokens_per_verify"], 2) + " tokens per verifying step, "
           + num(r["speculation"]["acceptance"], 3) + " of drafts accepted\n";
  if (r.contains("structured"))
    out += "  structured  " + std::to_string(r["structured"]["requests"].get<std::uint64_t>())
           + " requests constrained, " + num(r["structured"]["mask_s"].get<double>() * 1e6, 1)
           + " us per token mask, " + num(r["structured"]["compile_s"].get<double>() * 1e3, 2)
           + " ms per compile\n";
  if (r.contains("prefill"))
    out += "  prefilled   " + std::to_string(r["prefill"]["computed_tokens"].get<std::uint64_t>())
           + " tokens computed for " + std::to_string(r["prefill"]["jobs"].get<std::uint64_t>())
           + " jobs in " + num(r["prefill"]["device_s"], 1) + " device-seconds (window state "
           + (r["prefill"]["rebuild"] == "exact" ? "rebuilt exactly" : "by bounded replay")
           + ")\n";
  if (r.contains("scheduling"))
    out += std::string("  scheduling  ")
           + (r["scheduling"]["overlap"].get<bool>() ? "overlapped" : "not overlapped")
           + ": decode devices waited " + num(r["scheduling"]["scheduler_wait_s"], 2)
           + " s for the scheduler (" + num(r["scheduling"]["wait_share"].get<double>() * 100, 1)
           + "% of their time)\n";
  if (r.contains("experts"))
    out += "  experts     skew " + num(r["experts"]["skew"], 2) + (r["experts"]["eplb"].get<bool>() ? ", EPLB" : ", contiguous")
           + ": balancedness prefill " + num(r["experts"]["prefill_balancedness"], 3) + ", decode "
           + num(r["experts"]["decode_balancedness"], 3) + " (decode contiguous "
           + num(r["experts"]["decode_balancedness_contiguous"], 3) + ", EPLB "
           + num(r["experts"]["decode_balancedness_eplb"], 3) + "); over the run: prefill "
           + num(r["experts"]["prefill_balancedness_mean"], 3) + ", decode "
           + num(r["experts"]["decode_balancedness_mean"], 3) + ", "
           + std::to_string(r["experts"]["placements_published"].get<std::uint64_t>())
           + (r["experts"]["placements_published"].get<std::uint64_t>() == 1 ? " placement" : " placements")
           + " published\n";
  out += "  kv cache    block hit rate " + num(r["kv"]["block_hit_rate"].get<double>() * 100)
         + "%, token hit rate " + num(r["kv"]["token_hit_rate"].get<double>() * 100) + "%, "
         + std::to_string(r["kv"]["persisted_blocks"].get<std::uint64_t>())
         + " blocks persisted by decode\n";
  if (r.contains("lb") && r["lb"].contains("vision"))
    out += "  vision      " + std::to_string(r["lb"]["vision"]["routed"].get<std::uint64_t>())
           + " requests encoded\n";
  if (r.contains("invariants")) {
    auto& inv = r["invariants"];
    auto broken = inv["violations"].size();
    out += "  invariants  " + std::to_string(inv["checked"].get<std::uint64_t>())
           + " requests checked, " + std::to_string(broken)
           + (broken == 1 ? " violation\n" : " violations\n");
  }
  if (q.contains("rerouted"))
    out += "  reroutes    " + std::to_string(q["rerouted"].get<std::uint64_t>())
           + " requests rerouted (" + std::to_string(q["reroutes"].get<std::uint64_t>())
           + " reroutes)\n";
  if (q.contains("forwarded") && q["forwarded"].get<std::uint64_t>() > 0)
    out += "  drains      " + std::to_string(q["forwarded"].get<std::uint64_t>())
           + " requests forwarded with their KV (" + std::to_string(q["forwards"].get<std::uint64_t>())
           + " forwards)\n";
  if (r.contains("faults")) {
    auto& f = r["faults"];
    out += "  faults      " + std::to_string(f["timeline"].size()) + " planned by "
           + f.value("plan", std::string{"the plan"}) + ", "
           + std::to_string(f.value("injected_count", std::uint64_t{0})) + " injected";
    if (f.contains("not_injected_yet") && !f["not_injected_yet"].empty()) {
      out += "; not injected yet:";
      for (auto& k : f["not_injected_yet"])
        out += " " + k.get<std::string>();
    }
    out += "\n";
  }
  if (r.contains("autoscaler")) {
    // Scale-ups and scale-downs (instances) and each pool's peak target.
    std::uint64_t up = 0, down = 0;
    std::map<std::string, std::uint64_t> peak;
    for (auto& d : r["autoscaler"]["decisions"])
      for (auto& [pool, p] : d["pools"].items()) {
        up += p["up"].get<std::uint64_t>();
        down += p["down"].get<std::uint64_t>();
        peak[pool] = std::max(peak[pool], p["target"].get<std::uint64_t>());
      }
    out += "  autoscaler  " + std::to_string(r["autoscaler"]["decisions"].size()) + " decisions, "
           + std::to_string(up) + " instances added, " + std::to_string(down) + " removed; peak";
    for (auto& [pool, n] : peak)
      out += " " + pool + " " + std::to_string(n);
    out += "\n";
  }
  auto& g = r["gpus"];
  out += "  gpus        " + std::to_string(g["total"].get<std::uint64_t>()) + " at start, "
         + num(g["gpu_hours_held"], 2) + " GPU-hours held, busy share "
         + num(g["busy_share"].get<double>() * 100) + "%, "
         + num(g["output_tokens_per_gpu_hour"], 0) + " output tokens per GPU-hour\n";
  for (auto& [pool, p] : g["pools"].items()) {
    auto pad = std::string(pool.size() < 12 ? 12 - pool.size() : 1, ' ');
    out += "  " + pool + pad + "busy share " + num(p["busy_share"].get<double>() * 100)
           + "%, MFU " + num(p["mfu"].get<double>() * 100) + "%, HBM bandwidth "
           + num(p["hbm_bandwidth_share"].get<double>() * 100) + "%\n";
    if (p.contains("batch_occupancy"))
      out += "  " + std::string(pool.size() + pad.size(), ' ') + "batch occupancy "
             + num(p["batch_occupancy"].get<double>() * 100) + "% ("
             + num(p["sequences_per_step"]) + " sequences per step), KV occupancy "
             + num(p["kv_occupancy"].get<double>() * 100, 2) + "% (peak "
             + num(p["kv_occupancy_peak"].get<double>() * 100, 2) + "%)\n";
  }
  out += "  simulated   " + num(r["sim"]["virtual_s"]) + " s virtual, "
         + std::to_string(r["sim"]["events"].get<std::uint64_t>()) + " events in "
         + num(run["wall_s"], 2) + " s wall (" + num(run["virtual_s_per_wall_s"], 0)
         + "x real time, peak RSS " + num(run["peak_rss_mib"], 0) + " MiB)\n";
  return out;
}

} // namespace troupe::cluster::sim

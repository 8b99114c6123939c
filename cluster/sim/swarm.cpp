#include "cluster/sim/swarm.hpp"

#include "cluster/sim/progress_bar.hpp"

#include "cluster/sim/workload.hpp"
#include "runtime/random.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <iomanip>
#include <map>
#include <mutex>
#include <thread>

namespace troupe::cluster::sim {

namespace {

using namespace std::chrono_literals;

runtime::duration seconds_between(runtime::rng& r, std::int64_t lo, std::int64_t hi) {
  return std::chrono::duration_cast<runtime::duration>(std::chrono::seconds{r.between(lo, hi)});
}

fault_place place_of(const pool_spec& pool, std::uint32_t instance) {
  fault_place p;
  p.pool = pool.name;
  p.instance = instance;
  p.initial_instances = pool.instances.initial;
  p.gpus_per_instance = pool.gpus_per_instance;
  return p;
}

} // namespace

swarm_case draw_swarm_case(const topology& topo, std::uint64_t seed, bool plant_bug) {
  swarm_case c;
  c.seed = seed;
  auto root = runtime::rng{seed}.split("swarm");

  // The workload: a minute or two of chat and agent sessions at a small rate.
  auto wr = root.split("workload");
  auto knobs = root.split("workload-knobs");
  mixed_params wp;
  wp.rate = 0.5 + 1.5 * knobs.uniform();
  wp.duration = seconds_between(knobs, 60, 120);
  wp.agent_share = knobs.uniform() * 0.6;
  // Short agent sessions: a swarm seed should run in well under a second.
  wp.agent.mean_steps = 4;
  auto w = generate_mixed(wp, wr);
  c.records = std::move(w.records);
  c.options.params.image_tokens = wp.chat.image_tokens;
  if (topo.storage.shards > 0)
    c.options.params.kv_shards = topo.storage.shards;

  // The plan (BUGGIFY-style): the seed switches each injectable kind on or off, then draws
  // how many faults, when and on what.
  auto pr = root.split("plan");
  std::vector<const pool_spec*> all, decode;
  for (const auto& p : topo.pools) {
    if (p.instances.initial == 0)
      continue;
    all.push_back(&p);
    if (p.role == pool_role::decode)
      decode.push_back(&p);
  }
  bool gpu_fail = pr.chance(0.6), instance_fail = pr.chance(0.4),
       drain = !decode.empty() && pr.chance(0.3);
  std::vector<int> kinds; // 0 gpu fail, 1 instance fail, 2 decode drain
  if (gpu_fail)
    kinds.push_back(0);
  if (instance_fail)
    kinds.push_back(1);
  if (drain)
    kinds.push_back(2);
  auto count = kinds.empty() || all.empty() ? 0 : pr.between(0, 4);
  // Faults fall while requests arrive and a little after.
  auto window = std::chrono::duration_cast<std::chrono::seconds>(wp.duration).count() + 30;
  for (std::int64_t i = 0; i < count; ++i) {
    fault f;
    f.at = seconds_between(pr, 0, window);
    f.entry = static_cast<std::size_t>(i);
    f.line = 0;
    f.note = "swarm seed " + std::to_string(seed);
    switch (kinds[pr.below(kinds.size())]) {
      case 0: {
        auto& pool = *all[pr.below(all.size())];
        f.kind = fault_kind::fail;
        f.target.kind = target_kind::gpu;
        f.target.place = place_of(pool, static_cast<std::uint32_t>(pr.below(pool.instances.initial)));
        f.target.place.rank = static_cast<std::uint32_t>(pr.below(pool.gpus_per_instance));
        break;
      }
      case 1: {
        auto& pool = *all[pr.below(all.size())];
        f.kind = fault_kind::fail;
        f.target.kind = target_kind::instance;
        f.target.place = place_of(pool, static_cast<std::uint32_t>(pr.below(pool.instances.initial)));
        break;
      }
      default: {
        auto& pool = *decode[pr.below(decode.size())];
        f.kind = fault_kind::drain;
        f.target.kind = target_kind::instance;
        f.target.place = place_of(pool, static_cast<std::uint32_t>(pr.below(pool.instances.initial)));
        f.grace = seconds_between(pr, 1, 90);
        break;
      }
    }
    c.options.faults.push_back(std::move(f));
  }
  // Surges, from their own stream (so the draws above are the same with or without them):
  // on for some seeds, one or two, traffic x1.5-5 for 10-60 s within the arrival window.
  auto sr = root.split("surge");
  bool surges = sr.chance(0.3);
  const std::int64_t surge_count = surges ? sr.between(1, 2) : 0;
  for (std::int64_t i = 0; i < surge_count; ++i) {
    fault f;
    f.kind = fault_kind::surge;
    f.at = seconds_between(sr, 0, window - 30);
    f.factor = 1.5 + 3.5 * sr.uniform();
    f.duration = seconds_between(sr, 10, 60);
    f.entry = static_cast<std::size_t>(count + i);
    f.line = 0;
    f.note = "swarm seed " + std::to_string(seed);
    c.options.faults.push_back(std::move(f));
  }
  // The later kinds, from a stream of their own (so the draws above are those of earlier
  // swarms): gpu fail with a recovery, slowdowns, KV store shard failures, whole-pool
  // failures, prefill drains. Each on or off per seed, then 0-3 faults among those on.
  auto more = root.split("plan-more");
  std::vector<const pool_spec*> prefill;
  for (auto* p : all)
    if (p->role == pool_role::prefill)
      prefill.push_back(p);
  bool gpu_blip = more.chance(0.3), slow = more.chance(0.3), store = more.chance(0.3),
       pool_fail = more.chance(0.1), prefill_drain = !prefill.empty() && more.chance(0.15),
       link_fault = !prefill.empty() && !decode.empty() && more.chance(0.25);
  // 0 gpu fail + recover, 1 slow, 2 store_fail, 3 pool fail, 4 prefill drain, 5 partition or
  // slow of a prefill <-> decode link
  std::vector<int> later;
  for (auto [on, k] : {std::pair{gpu_blip, 0}, std::pair{slow, 1}, std::pair{store, 2},
                       std::pair{pool_fail, 3}, std::pair{prefill_drain, 4},
                       std::pair{link_fault, 5}})
    if (on)
      later.push_back(k);
  auto more_count = later.empty() || all.empty() ? 0 : more.between(0, 3);
  for (std::int64_t i = 0; i < more_count; ++i) {
    fault f;
    f.at = seconds_between(more, 0, window);
    f.entry = static_cast<std::size_t>(count + surge_count + i);
    f.note = "swarm seed " + std::to_string(seed);
    auto& pool = *all[more.below(all.size())];
    auto instance = static_cast<std::uint32_t>(more.below(pool.instances.initial));
    switch (later[more.below(later.size())]) {
      case 0:
        f.kind = fault_kind::fail;
        f.target.kind = target_kind::gpu;
        f.target.place = place_of(pool, instance);
        f.target.place.rank = static_cast<std::uint32_t>(more.below(pool.gpus_per_instance));
        f.duration = seconds_between(more, 10, 400);
        break;
      case 1:
        f.kind = fault_kind::slow;
        f.target.kind = more.chance(0.5) ? target_kind::instance : target_kind::gpu;
        f.target.place = place_of(pool, instance);
        if (f.target.kind == target_kind::gpu)
          f.target.place.rank = static_cast<std::uint32_t>(more.below(pool.gpus_per_instance));
        f.factor = 1.5 + 8.5 * more.uniform();
        f.duration = seconds_between(more, 5, 120);
        break;
      case 2:
        f.kind = fault_kind::store_fail;
        f.target.kind = target_kind::shard;
        f.target.shard = static_cast<std::uint32_t>(more.below(c.options.params.kv_shards));
        if (more.chance(0.7))
          f.duration = seconds_between(more, 5, 300);
        break;
      case 3:
        f.kind = fault_kind::fail;
        f.target.kind = target_kind::pool;
        f.target.place.pool = pool.name;
        break;
      case 5: {
        auto& d = *decode[more.below(decode.size())];
        f.kind = more.chance(0.5) ? fault_kind::partition : fault_kind::slow;
        f.target.kind = target_kind::link;
        f.target.place.pool = prefill[more.below(prefill.size())]->name;
        f.target.peer = place_of(d, static_cast<std::uint32_t>(more.below(d.instances.initial)));
        if (f.kind == fault_kind::slow)
          f.factor = 2 + 98 * more.uniform();
        f.duration = seconds_between(more, 5, 90);
        break;
      }
      default: {
        auto& p = *prefill[more.below(prefill.size())];
        f.kind = fault_kind::drain;
        f.target.kind = target_kind::instance;
        f.target.place = place_of(p, static_cast<std::uint32_t>(more.below(p.instances.initial)));
        break;
      }
    }
    c.options.faults.push_back(std::move(f));
  }
  // A slow KV store shard, from a stream of its own (so every draw above is unchanged): on
  // for some seeds, one shard x2-1000 (its lookups 0.4-200 ms) for 5-120 s.
  auto ssr = root.split("store-slow");
  bool store_slow = ssr.chance(0.2);
  if (store_slow) {
    fault f;
    f.kind = fault_kind::store_slow;
    f.at = seconds_between(ssr, 0, window);
    f.target.kind = target_kind::shard;
    f.target.shard = static_cast<std::uint32_t>(ssr.below(c.options.params.kv_shards));
    f.factor = 2 + 998 * ssr.uniform();
    f.duration = seconds_between(ssr, 5, 120);
    f.entry = static_cast<std::size_t>(count + surge_count + more_count);
    f.note = "swarm seed " + std::to_string(seed);
    c.options.faults.push_back(std::move(f));
  }
  // Short TTLs and tight decode limits, from streams of their own (so every draw above is
  // unchanged), so that the history checker's TTL and capacity checks meet real cases: for
  // some seeds each class's blocks live 5-90 s (they expire, are missed and written again
  // within the run); for others a decode instance holds 1-4 times the largest request's KV
  // (prompt + output) and 1-2 requests per GPU, so routing waits for room.
  auto tr = root.split("ttl");
  bool short_ttl = tr.chance(0.5);
  if (short_ttl) {
    c.options.params.kv_ttl["chatbot"] = seconds_between(tr, 5, 90);
    c.options.params.kv_ttl["agent"] = seconds_between(tr, 5, 90);
  }
  auto tight = root.split("decode-tight");
  bool tight_decode = tight.chance(0.3);
  if (tight_decode) {
    std::uint64_t largest = 1;
    for (const auto& r : c.records)
      largest = std::max<std::uint64_t>(largest, r.input_tokens + r.output_tokens);
    c.options.params.decode_kv_tokens = largest * static_cast<std::uint64_t>(tight.between(1, 4));
    c.options.params.decode_requests_per_gpu = static_cast<std::uint32_t>(tight.between(1, 2));
  }
  c.options.check_history = true;
  std::stable_sort(c.options.faults.begin(), c.options.faults.end(),
                   [](const fault& a, const fault& b) { return a.at < b.at; });

  c.options.seed = seed;
  c.options.params.test_drop_on_reroute = plant_bug;
  // The liveness bound: every request has ended by its deadline, restarts included, long
  // before this.
  c.options.until = wp.duration + 30s + c.options.params.request_deadline
                    + 4 * c.options.params.restart_time;
  std::vector<std::string> enabled;
  if (gpu_fail)
    enabled.emplace_back("gpu fail");
  if (instance_fail)
    enabled.emplace_back("instance fail");
  if (drain)
    enabled.emplace_back("decode drain");
  if (surges)
    enabled.emplace_back("surge");
  for (auto [on, name] : {std::pair{gpu_blip, "gpu fail + recover"}, std::pair{slow, "slow"},
                          std::pair{store, "store_fail"}, std::pair{pool_fail, "pool fail"},
                          std::pair{prefill_drain, "prefill drain"},
                          std::pair{link_fault, "link partition / slow"},
                          std::pair{store_slow, "store_slow"}, std::pair{short_ttl, "short ttl"},
                          std::pair{tight_decode, "tight decode"}})
    if (on)
      enabled.emplace_back(name);
  nlohmann::json ttl = nlohmann::json::object();
  for (auto& [cls, d] : c.options.params.kv_ttl)
    ttl[cls] = runtime::to_seconds(d);
  c.drawn = {{"seed", seed},
             {"ttl_s", std::move(ttl)},
             {"decode_kv_tokens", c.options.params.decode_kv_tokens},
             {"decode_requests_per_gpu", c.options.params.decode_requests_per_gpu},
             {"rate", wp.rate},
             {"duration_s", runtime::to_seconds(wp.duration)},
             {"agent_share", wp.agent_share},
             {"requests", c.records.size()},
             {"kinds", enabled},
             {"faults", to_json(c.options.faults)},
             {"until_s", runtime::to_seconds(*c.options.until)}};
  return c;
}

std::vector<std::string> swarm_problems(const result<sim_outcome>& outcome) {
  std::vector<std::string> out;
  if (!outcome) {
    out.push_back("run failed: " + outcome.error());
    return out;
  }
  for (const auto& v : outcome->invariants.violations)
    out.push_back(v.to_string());
  if (!outcome->finished) {
    auto unfinished = outcome->report["requests"].value("unfinished", std::uint64_t{0});
    out.push_back("liveness: " + std::to_string(unfinished)
                  + " request(s) still unfinished at the swarm's bound");
  }
  return out;
}

swarm_seed_result run_swarm_seed(const topology& topo, std::uint64_t seed, bool plant_bug) {
  auto c = draw_swarm_case(topo, seed, plant_bug);
  swarm_seed_result r;
  r.seed = seed;
  r.requests = c.records.size();
  r.faults = c.options.faults.size();
  if (c.records.empty())
    return r; // nothing to run: trivially passes
  auto outcome = run_simulation(topo, c.records, c.options);
  r.problems = swarm_problems(outcome);
  if (outcome)
    r.coverage = swarm_coverage(outcome->report);
  return r;
}

std::map<std::string, std::uint64_t> swarm_coverage(const nlohmann::json& report) {
  std::map<std::string, std::uint64_t> c;
  auto count = [&](const std::string& name, const nlohmann::json& at, const char* key) {
    if (!at.is_object() || !at.contains(key) || !at[key].is_number())
      return;
    if (auto n = at[key].get<std::uint64_t>(); n > 0)
      c[name] += n;
  };
  const auto none = nlohmann::json::object();
  auto part = [&](const nlohmann::json& j, const char* key) -> const nlohmann::json& {
    return j.is_object() && j.contains(key) ? j[key] : none;
  };
  const auto& requests = part(report, "requests");
  count("forwards", requests, "forwards");
  count("reroutes", requests, "reroutes");
  count("failed requests", requests, "failed");
  count("decode spills", part(part(report, "lb"), "decode"), "spilled");
  const auto& store = part(part(report, "kv"), "store");
  count("KV expirations", store, "expirations");
  count("KV evictions", store, "evictions");
  if (auto it = report.find("timeline"); it != report.end() && it->is_array())
    for (const auto& e : *it)
      if (e.is_object() && e.contains("kind") && e["kind"].is_string())
        ++c["timeline " + e["kind"].get<std::string>()];
  return c;
}

bool parse_seed_range(const std::string& text, std::uint64_t& first, std::uint64_t& last,
                      std::string& error) {
  auto number = [](std::string_view s, std::uint64_t& v) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc{} && p == s.data() + s.size();
  };
  auto dots = text.find("..");
  std::string_view t{text};
  bool ok = dots == std::string::npos
              ? number(t, first) && (last = first, true)
              : number(t.substr(0, dots), first) && number(t.substr(dots + 2), last);
  if (!ok) {
    error = "--seeds must be A..B or A (non-negative integers), not '" + text + "'";
    return false;
  }
  if (first > last) {
    error = "--seeds " + text + ": the first seed is after the last";
    return false;
  }
  return true;
}

int run_swarm_command(const swarm_command_options& o, std::ostream& out, std::ostream& err) {
  auto topo = load_topology(o.topology);
  if (!topo.ok()) {
    for (auto& d : topo.errors)
      err << d.to_string() << "\n";
    return 1;
  }
  std::uint64_t first = 0, last = 0;
  std::string why;
  if (!parse_seed_range(o.seeds, first, last, why)) {
    err << "troupe swarm: " << why << "\n";
    return 1;
  }
  if (o.jobs == 0) {
    err << "troupe swarm: --jobs must be at least 1\n";
    return 1;
  }
  auto total = last - first + 1;
  std::vector<swarm_seed_result> results(total);
  std::atomic<std::uint64_t> next{0}, done{0};
  std::mutex io;
  auto wall_start = std::chrono::steady_clock::now();
  std::uint64_t failures = 0;
  // Progress on stderr: a bar redrawn in place on a terminal, nothing otherwise.
  progress_bar bar{stderr, !o.quiet};
  auto worker = [&] {
    for (;;) {
      auto i = next.fetch_add(1);
      if (i >= total)
        return;
      results[i] = run_swarm_seed(*topo.value, first + i, o.plant_bug);
      auto n = done.fetch_add(1) + 1;
      std::lock_guard lock{io};
      if (!results[i].passed()) {
        ++failures;
        bar.finish();
        err << "seed " << first + i << ": FAILED (" << results[i].problems.front() << ")\n";
      }
      bar.update(n, total,
                 "seeds  " + std::to_string(failures) + " failed  "
                   + std::to_string(static_cast<long long>(static_cast<double>(n) / std::max(1e-9, bar.wall_s()) * 60))
                   + " seeds/min",
                 n == total);
    }
  };
  auto jobs = static_cast<unsigned>(std::min<std::uint64_t>(o.jobs, total));
  std::vector<std::thread> threads;
  for (unsigned j = 1; j < jobs; ++j)
    threads.emplace_back(worker);
  worker();
  for (auto& t : threads)
    t.join();
  bar.finish();

  std::uint64_t failed = 0;
  for (auto& r : results)
    failed += r.passed() ? 0 : 1;
  auto wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  out << (total - failed) << " passed, " << failed << " failed";
  if (!o.quiet && wall > 0)
    out << "  (" << static_cast<long long>(static_cast<double>(total) / wall * 60)
        << " seeds/min)";
  out << "\n";
  {
    // Which paths the seeds took: a path no seed takes is a path the swarm does not test.
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> paths; // seeds, total
    for (auto& r : results)
      for (auto& [name, n] : r.coverage) {
        ++paths[name].first;
        paths[name].second += n;
      }
    out << "coverage (seeds that took each path, of " << total << "; times in all):\n";
    for (auto& [name, v] : paths)
      out << "  " << std::left << std::setw(24) << name << std::right << std::setw(8) << v.first
          << " seeds  " << std::setw(10) << v.second << "\n";
  }
  for (auto& r : results) {
    if (r.passed())
      continue;
    out << "seed " << r.seed << ": " << r.problems.size() << " problem(s), first: "
        << r.problems.front() << "\n";
    out << "  replay: " << o.program << " sim " << o.topology << " --swarm-seed " << r.seed
        << (o.plant_bug ? " --plant-bug" : "") << "\n";
  }
  return failed == 0 ? 0 : 2;
}

} // namespace troupe::cluster::sim

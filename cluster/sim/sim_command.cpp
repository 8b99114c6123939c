#include "cluster/sim/sim_command.hpp"

#include "cluster/sim/fault_plan.hpp"
#include "cluster/sim/progress_bar.hpp"
#include "cluster/sim/report_html.hpp"
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/swarm.hpp"
#include "cluster/sim/trace.hpp"
#include "cluster/sim/workload.hpp"
#include "runtime/random.hpp"
#include "runtime/units.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace troupe::cluster::sim {

namespace {

bool write_file(const std::filesystem::path& path, const std::string& text, std::ostream& err) {
  std::ofstream f{path, std::ios::binary};
  f << text;
  f.close();
  if (!f) {
    err << "troupe sim: cannot write " << path.string() << "\n";
    return false;
  }
  return true;
}

/// `--profile`'s table: the 40 most frequent (actor, message) pairs with their count, share
/// of all events, events per admitted request, wall time and nanoseconds per event.
std::string profile_table(const nlohmann::json& rows, std::uint64_t events, std::uint64_t requests) {
  std::string out = "profile: " + std::to_string(events) + " events, "
                    + std::to_string(requests) + " requests admitted\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-22s %-34s %12s %7s %9s %9s %8s\n", "actor", "message",
                "count", "share", "per req", "wall ms", "ns/evt");
  out += line;
  std::size_t shown = 0;
  for (auto& r : rows) {
    if (++shown > 40) {
      out += "  ... " + std::to_string(rows.size() - 40) + " more rows\n";
      break;
    }
    auto count = r["count"].get<std::uint64_t>();
    auto wall = r["wall_s"].get<double>();
    std::snprintf(line, sizeof line, "  %-22.22s %-34.34s %12llu %6.2f%% %9.2f %9.1f %8.0f\n",
                  r["actor"].get<std::string>().c_str(), r["message"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(count),
                  events > 0 ? 100.0 * static_cast<double>(count) / static_cast<double>(events) : 0.0,
                  requests > 0 ? static_cast<double>(count) / static_cast<double>(requests) : 0.0,
                  wall * 1e3, count > 0 ? wall / static_cast<double>(count) * 1e9 : 0.0);
    out += line;
  }
  return out;
}

} // namespace

int run_sim_command(const sim_command_options& o, std::ostream& out, std::ostream& err) {
  auto topo = load_topology(o.topology);
  if (!topo.ok()) {
    for (auto& d : topo.errors)
      err << d.to_string() << "\n";
    return 1;
  }
  sim_options options;
  options.seed = o.seed;
  if (topo.value->storage.shards > 0)
    options.params.kv_shards = topo.value->storage.shards;
  if (!o.until.empty()) {
    auto until = runtime::parse_duration(o.until);
    if (!until) {
      err << "troupe sim: --until: " << until.error << "\n";
      return 1;
    }
    options.until = until.value;
  }

  // The workload.
  std::vector<request_record> records;
  nlohmann::json faults;
  if (o.swarm_seed) {
    // A swarm seed brings its own workload, plan, seed and bound.
    auto c = draw_swarm_case(*topo.value, *o.swarm_seed, o.plant_bug);
    records = std::move(c.records);
    options = std::move(c.options);
    faults = {{"plan", "swarm seed " + std::to_string(*o.swarm_seed)},
              {"drawn", c.drawn},
              {"injected", false},
              {"timeline", to_json(options.faults)}};
  } else if (!o.trace.empty()) {
    load_options lo;
    lo.speedup = o.speedup;
    lo.strict = o.strict;
    lo.max_records = o.limit;
    auto loaded = load_trace(o.trace, lo);
    // The first bad lines, then a count: a file that is not a trace at all says so once.
    constexpr std::size_t shown = 20;
    for (std::size_t i = 0; i < loaded.diagnostics.size() && i < shown; ++i)
      err << loaded.diagnostics[i].to_string() << "\n";
    if (loaded.diagnostics.size() > shown)
      err << "troupe sim: ... and " << loaded.diagnostics.size() - shown
          << " more bad line(s)\n";
    if (!loaded.ok)
      return 1;
    if (!loaded.diagnostics.empty() && !o.quiet)
      err << "troupe sim: " << loaded.diagnostics.size() << " bad line(s) skipped (--strict "
          << "makes them fatal)\n";
    records = std::move(loaded.records);
  } else {
    auto duration = runtime::parse_duration(o.duration);
    if (!duration) {
      err << "troupe sim: --duration: " << duration.error << "\n";
      return 1;
    }
    if (!(o.rate > 0)) {
      err << "troupe sim: --rate must be > 0 requests per second\n";
      return 1;
    }
    runtime::rng root{o.seed};
    auto random = root.split("workload");
    workload w;
    if (o.workload == "chat") {
      chat_params p;
      p.rate = o.rate;
      p.duration = duration.value;
      w = generate_chat(p, random);
      options.params.image_tokens = p.image_tokens;
    } else if (o.workload == "agent") {
      agent_params p;
      p.rate = o.rate;
      p.duration = duration.value;
      w = generate_agent(p, random);
    } else if (o.workload == "mixed") {
      mixed_params p;
      p.rate = o.rate;
      p.duration = duration.value;
      w = generate_mixed(p, random);
      options.params.image_tokens = p.chat.image_tokens;
    } else {
      err << "troupe sim: --workload must be chat, agent or mixed, not '" << o.workload << "'\n";
      return 1;
    }
    if (!w.ok()) {
      err << "troupe sim: " << w.error << "\n";
      return 1;
    }
    records = std::move(w.records);
    if (o.limit && records.size() > *o.limit)
      records.resize(*o.limit);
  }
  if (records.empty()) {
    err << "troupe sim: the workload has no requests\n";
    return 1;
  }

  // The fault plan: validated and expanded up to the horizon (--until, or the last arrival),
  // injected into the run (fault_injection.hpp) and listed in the report.
  if (!o.swarm_seed && !o.faults.empty()) {
    fault_limits limits;
    limits.store_shards = options.params.kv_shards;
    auto plan = load_fault_plan(o.faults, *topo.value, limits);
    if (!plan.ok()) {
      for (auto& d : plan.errors)
        err << d.to_string() << "\n";
      return 1;
    }
    runtime::duration horizon = records.back().arrival;
    for (const auto& r : records)
      horizon = std::max(horizon, r.arrival);
    if (options.until)
      horizon = *options.until;
    auto timeline = expand(*plan.value, runtime::rng{o.seed}.split("faults"), horizon);
    options.faults = timeline;
    faults = {{"plan", o.faults},
              {"name", plan.value->name},
              {"injected", false},
              {"horizon_s", runtime::to_seconds(horizon)},
              {"timeline", to_json(timeline)}};
  }

  // Progress on stderr: a bar redrawn in place on a terminal, nothing otherwise.
  options.params.test_drop_on_reroute = options.params.test_drop_on_reroute || o.plant_bug;
  if (!(o.expert_skew >= 0.0) || o.expert_skew > 10.0) {
    err << "troupe sim: --expert-skew " << o.expert_skew << ": expected 0 .. 10\n";
    return 1;
  }
  options.params.expert_skew = o.expert_skew;
  options.params.eplb = o.eplb;
  if (!(o.structured >= 0.0) || o.structured > 1.0) {
    err << "troupe sim: --structured " << o.structured << ": expected a share in 0 .. 1\n";
    return 1;
  }
  options.params.structured_share = o.structured;
  if (!o.expert_drift.empty()) {
    auto drift = runtime::parse_duration(o.expert_drift);
    if (!drift || drift.value <= runtime::duration{0}) {
      err << "troupe sim: --expert-drift " << o.expert_drift << ": expected a duration > 0 (e.g. 2min)\n";
      return 1;
    }
    options.params.expert_drift = drift.value;
  }
  {
    auto interval = runtime::parse_duration(o.eplb_interval == "0" ? "0s" : o.eplb_interval);
    if (!interval || interval.value < runtime::duration{0}) {
      err << "troupe sim: --eplb-interval " << o.eplb_interval
          << ": expected a duration (0: place once at start)\n";
      return 1;
    }
    options.params.eplb_interval = interval.value;
  }
  if (auto spec = actors::parse_speculation(o.spec)) {
    options.params.speculation = spec->spec;
    options.params.fixed_drafts = spec->fixed_drafts;
  } else {
    err << "troupe sim: --spec " << o.spec << ": expected off, fixed1 .. fixed5 or dspark\n";
    return 1;
  }
  if (o.overlap != "on" && o.overlap != "off") {
    err << "troupe sim: --overlap " << o.overlap << ": expected on or off\n";
    return 1;
  }
  options.params.overlap = o.overlap == "on";
  if (o.swa_rebuild != "bounded" && o.swa_rebuild != "exact") {
    err << "troupe sim: --swa-rebuild " << o.swa_rebuild << ": expected bounded or exact\n";
    return 1;
  }
  options.params.exact_rebuild = o.swa_rebuild == "exact";
  options.params.stream_kv = o.kv_stream;
  progress_bar bar{stderr, !o.quiet};
  if (bar.active())
    options.progress = [&bar](const sim_progress_info& p) {
      char detail[128];
      std::snprintf(detail, sizeof detail, "requests  t=%.0fs virtual  %.2fM events/s",
                    p.virtual_s, static_cast<double>(p.events) / std::max(1e-9, bar.wall_s()) / 1e6);
      bar.update(p.finished, p.total, detail);
    };
  options.profile = o.profile;
  options.check_history = options.check_history || o.check_history;
  auto outcome = run_simulation(*topo.value, records, options);
  bar.finish();
  if (!outcome) {
    err << "troupe sim: " << outcome.error() << "\n";
    return 1;
  }
  auto& result = *outcome;
  if (o.profile && result.run.contains("profile"))
    err << profile_table(result.run["profile"], result.report["sim"]["events"].get<std::uint64_t>(),
                         result.report["requests"]["admitted"].get<std::uint64_t>());
  if (result.report.contains("warnings"))
    for (auto& w : result.report["warnings"])
      err << "troupe sim: warning: " << w.get<std::string>() << "\n";
  if (!faults.is_null()) {
    // The run's own account (what was injected) wins over the plan's listing.
    if (result.report.contains("faults"))
      faults.update(result.report["faults"]);
    result.report["faults"] = std::move(faults);
  }
  if (!o.report_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.report_dir, ec);
    if (ec) {
      err << "troupe sim: cannot create " << o.report_dir << ": " << ec.message() << "\n";
      return 1;
    }
    auto dir = std::filesystem::path{o.report_dir};
    if (!write_file(dir / "report.json", result.report.dump(2) + "\n", err)
        || !write_file(dir / "run.json", result.run.dump(2) + "\n", err)
        || !write_file(dir / "report.html", render_html(result.report, result.run), err))
      return 1;
  }
  if (o.json) {
    out << result.report.dump(2) << "\n";
  } else {
    out << summarize(result.report, result.run);
    if (!o.report_dir.empty())
      out << "  report      " << (std::filesystem::path{o.report_dir} / "report.html").string()
          << "\n";
  }
  if (!result.invariants.ok()) {
    for (const auto& v : result.invariants.violations)
      err << v.to_string() << "\n";
    err << "troupe sim: " << result.invariants.violations.size()
        << " invariant violation(s) in " << result.invariants.checked << " requests\n";
    return 2;
  }
  if (o.swarm_seed && !result.finished) {
    err << "troupe sim: liveness: "
        << result.report["requests"].value("unfinished", std::uint64_t{0})
        << " request(s) still unfinished at the swarm's bound\n";
    return 2;
  }
  return 0;
}

} // namespace troupe::cluster::sim

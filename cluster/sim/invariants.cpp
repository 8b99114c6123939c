// invariants: the end-of-run "nothing lost" checks over request outcomes.
#include "cluster/sim/invariants.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace troupe::cluster::sim {

std::string violation::to_string() const {
  if (!about.empty())
    return fmt::format("{}: {}", about, what);
  return fmt::format("request {}: {}", request, what);
}

nlohmann::json invariant_report::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& v : violations)
    if (v.about.empty())
      list.push_back({{"request", v.request}, {"what", v.what}});
    else
      list.push_back({{"about", v.about}, {"what", v.what}});
  return {{"checked", checked}, {"violations", std::move(list)}};
}

namespace {

std::string describe(const actors::request_outcome& o) {
  if (o.completed)
    return "completed";
  return fmt::format("failed ('{}')", o.failure);
}

// The checks of one outcome taken alone.
void check_outcome(const actors::request_outcome& o, std::vector<violation>& out) {
  auto add = [&](std::string what) { out.push_back({o.id, std::move(what), {}}); };
  if (o.completed) {
    if (!o.failure.empty())
      add(fmt::format("completed, yet carries the failure reason '{}'", o.failure));
    if (o.delivered_tokens < o.output_tokens && !o.stopped)
      add(fmt::format("completed after delivering {} of its {} output tokens",
                      o.delivered_tokens, o.output_tokens));
    // Deterministic decoding: the stream must be the fault-free run's, token for token.
    else if (o.delivered_tokens == o.output_tokens
             && o.token_digest
                  != actors::modelled_digest(0, o.id, o.input_tokens, 0, o.output_tokens))
      add("delivered a token stream that differs from its fault-free run's (a token lost, "
          "repeated or out of order)");
  } else if (o.failure.empty()) {
    add("failed without a reason the client sees");
  }
  if (o.delivered_tokens > o.output_tokens)
    add(fmt::format("delivered {} tokens for an output of {}: a token was delivered twice",
                    o.delivered_tokens, o.output_tokens));
  auto ms = [&](runtime::time_point t) {
    return std::chrono::duration<double, std::milli>(t - o.admitted).count();
  };
  if (o.finished < o.admitted)
    add(fmt::format("finished {:.3f} ms before it was admitted", -ms(o.finished)));
  // The first token is set once prefill ended: always for a completed request, and for a
  // failed one that delivered anything.
  if (o.completed || o.delivered_tokens > 0) {
    if (o.first_token < o.admitted)
      add(fmt::format("first token {:.3f} ms before it was admitted", -ms(o.first_token)));
    else if (o.first_token > o.finished)
      add(fmt::format("first token at {:.3f} ms, after it finished at {:.3f} ms",
                      ms(o.first_token), ms(o.finished)));
  }
}

} // namespace

invariant_report check_invariants(const std::vector<std::uint64_t>& admitted,
                                  const std::vector<actors::request_outcome>& outcomes,
                                  bool run_finished) {
  // Sorted flat lists rather than maps (an hour at 200/s is 720 k requests, checked when the
  // run's memory peaks): (id, arrival index) of every outcome, so each id's outcomes form one
  // run in arrival order, and the admitted ids.
  std::vector<std::pair<std::uint64_t, std::size_t>> by_id;
  by_id.reserve(outcomes.size());
  for (std::size_t i = 0; i < outcomes.size(); ++i)
    by_id.emplace_back(outcomes[i].id, i);
  std::sort(by_id.begin(), by_id.end());
  auto was = admitted;
  std::sort(was.begin(), was.end());
  was.erase(std::unique(was.begin(), was.end()), was.end());

  invariant_report report;
  std::vector<const actors::request_outcome*> list;
  // Every id admitted or reported, ascending: a merge of the two lists.
  for (std::size_t a = 0, b = 0; a < was.size() || b < by_id.size();) {
    const auto id = b == by_id.size()   ? was[a]
                    : a == was.size()   ? by_id[b].first
                                        : std::min(was[a], by_id[b].first);
    const bool was_admitted = a < was.size() && was[a] == id;
    if (was_admitted)
      ++a;
    list.clear();
    for (; b < by_id.size() && by_id[b].first == id; ++b)
      list.push_back(&outcomes[by_id[b].second]);
    ++report.checked;
    if (list.empty()) {
      if (run_finished)
        report.violations.push_back({id, "admitted but never reached a terminal state", {}});
      continue;
    }
    if (!was_admitted)
      report.violations.push_back(
        {id, fmt::format("{} without having been admitted", describe(*list.front())), {}});
    if (list.size() > 1) {
      std::string states;
      for (const auto* o : list)
        states += (states.empty() ? "" : ", ") + describe(*o);
      report.violations.push_back(
        {id, fmt::format("ended {} times ({}); a request ends exactly once", list.size(),
                         states),
         {}});
    }
    for (const auto* o : list)
      check_outcome(*o, report.violations);
  }
  return report;
}

std::vector<violation> check_autoscaler(const actors::autoscaler_log& log,
                                        const actors::scale_limits& limits,
                                        runtime::time_point origin) {
  std::vector<violation> out;
  // Actions per (time, pool): instances ordered and told to leave.
  std::map<std::pair<runtime::time_point, std::string>, std::pair<std::uint32_t, std::uint32_t>>
    acted;
  for (const auto& e : log.events) {
    if (e.kind == "ordered")
      ++acted[{e.at, e.pool}].first;
    else if (e.kind == "leaving")
      ++acted[{e.at, e.pool}].second;
  }
  // Per pool: since when every decision has wanted fewer instances than it had (a scale-down
  // waits scale_down_after of that).
  std::map<std::string, runtime::time_point> below_since;
  for (const auto& r : log.decisions) {
    auto t = runtime::to_seconds(r.at - origin);
    for (std::size_t k = 0; k < r.decision.pools.size() && k < r.inputs.pools.size(); ++k) {
      const auto& in = r.inputs.pools[k];
      const auto& d = r.decision.pools[k];
      auto add = [&](std::string what) {
        out.push_back({0, fmt::format("at {:.3f} s, pool {}: {}", t, in.pool, what), "autoscaler"});
      };
      if (in.online + in.starting > in.max)
        add(fmt::format("{} instances held (online + starting), above max {}",
                        in.online + in.starting, in.max));
      if (d.target > in.max)
        add(fmt::format("target {} above max {}", d.target, in.max));
      if (d.down > 0 && d.target < in.min)
        add(fmt::format("scaled down to {}, below min {}", d.target, in.min));
      if (d.up > limits.max_step_up)
        add(fmt::format("added {} instances, above max_step_up {}", d.up, limits.max_step_up));
      if (d.down > limits.max_step_down)
        add(fmt::format("removed {} instances, above max_step_down {}", d.down,
                        limits.max_step_down));
      if (d.desired >= d.current)
        below_since.erase(in.pool);
      else
        below_since.emplace(in.pool, r.at);
      if (auto b = below_since.find(in.pool);
          d.down > 0 && (b == below_since.end() || r.at - b->second < limits.scale_down_after))
        add(fmt::format("scaled down after wanting fewer instances for {:.3f} s, before "
                        "scale_down_after {:.3f} s",
                        b == below_since.end() ? 0.0 : runtime::to_seconds(r.at - b->second),
                        runtime::to_seconds(limits.scale_down_after)));
      if (d.down > 0 && r.decision.occupancy > limits.occupancy_limit)
        add(fmt::format("scaled down at occupancy {:.4g} above the limit {:.4g}",
                        r.decision.occupancy, limits.occupancy_limit));
      auto a = acted.find({r.at, in.pool});
      auto ordered = a == acted.end() ? 0u : a->second.first;
      auto leaving = a == acted.end() ? 0u : a->second.second;
      if (ordered != d.up || leaving != d.down)
        add(fmt::format("decided +{} / -{} but ordered {} and told {} to leave", d.up, d.down,
                        ordered, leaving));
    }
  }
  return out;
}

} // namespace troupe::cluster::sim

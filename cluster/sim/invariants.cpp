// invariants: the end-of-run "nothing lost" checks over request outcomes.
#include "cluster/sim/invariants.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace troupe::cluster::sim {

std::string violation::to_string() const {
  return fmt::format("request {}: {}", request, what);
}

nlohmann::json invariant_report::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& v : violations)
    list.push_back({{"request", v.request}, {"what", v.what}});
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
  auto add = [&](std::string what) { out.push_back({o.id, std::move(what)}); };
  if (o.completed) {
    if (!o.failure.empty())
      add(fmt::format("completed, yet carries the failure reason '{}'", o.failure));
    if (o.delivered_tokens < o.output_tokens)
      add(fmt::format("completed after delivering {} of its {} output tokens",
                      o.delivered_tokens, o.output_tokens));
    // Deterministic decoding: the stream must be the fault-free run's, token for token.
    else if (o.delivered_tokens == o.output_tokens
             && o.token_digest != actors::stream_digest(0, o.id, 0, o.output_tokens))
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
  // id → the outcomes it reported, in arrival order.
  std::map<std::uint64_t, std::vector<const actors::request_outcome*>> by_id;
  for (const auto& o : outcomes)
    by_id[o.id].push_back(&o);
  std::map<std::uint64_t, bool> ids; // id → admitted
  for (auto id : admitted)
    ids[id] = true;
  for (const auto& [id, list] : by_id)
    ids.emplace(id, false);

  invariant_report report;
  report.checked = ids.size();
  for (const auto& [id, was_admitted] : ids) {
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      if (run_finished)
        report.violations.push_back({id, "admitted but never reached a terminal state"});
      continue;
    }
    const auto& list = it->second;
    if (!was_admitted)
      report.violations.push_back(
        {id, fmt::format("{} without having been admitted", describe(*list.front()))});
    if (list.size() > 1) {
      std::string states;
      for (const auto* o : list)
        states += (states.empty() ? "" : ", ") + describe(*o);
      report.violations.push_back(
        {id, fmt::format("ended {} times ({}); a request ends exactly once", list.size(),
                         states)});
    }
    for (const auto* o : list)
      check_outcome(*o, report.violations);
  }
  return report;
}

} // namespace troupe::cluster::sim

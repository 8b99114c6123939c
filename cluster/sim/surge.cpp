#include "cluster/sim/surge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace troupe::cluster::sim {

surge_clock::surge_clock(const std::vector<fault>& timeline, runtime::duration offset) {
  std::set<double> edges;
  struct window {
    double from, to, factor;
  };
  std::vector<window> windows;
  for (const auto& f : timeline) {
    if (f.kind != fault_kind::surge || !f.duration || f.factor <= 0)
      continue;
    auto from = std::max(0.0, runtime::to_seconds(f.at - offset));
    auto to = runtime::to_seconds(f.at - offset + *f.duration);
    if (to <= from)
      continue;
    windows.push_back({from, to, f.factor});
    edges.insert(from);
    edges.insert(to);
  }
  if (windows.empty())
    return;
  edges.insert(0.0);
  for (auto e : edges) {
    double rate = 1;
    for (auto& w : windows)
      if (w.from <= e && e < w.to)
        rate *= w.factor;
    segments_.push_back({e, rate});
  }
}

runtime::duration surge_clock::arrival(runtime::duration workload_time) const {
  if (segments_.size() < 2)
    return workload_time;
  auto a = runtime::to_seconds(workload_time);
  // Before the first surge the two clocks agree exactly.
  if (a <= segments_[1].start_s)
    return workload_time;
  double w = 0; // workload seconds at the start of segment i
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    auto& s = segments_[i];
    auto end = i + 1 < segments_.size() ? segments_[i + 1].start_s
                                        : std::numeric_limits<double>::infinity();
    auto span = (end - s.start_s) * s.rate;
    if (a <= w + span) {
      auto t = s.start_s + (a - w) / s.rate;
      return std::chrono::duration_cast<runtime::duration>(std::chrono::duration<double>(t));
    }
    w += span;
  }
  return workload_time; // not reached: the last segment is unbounded
}

} // namespace troupe::cluster::sim

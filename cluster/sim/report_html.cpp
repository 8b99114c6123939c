#include "cluster/sim/report_html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace troupe::cluster::sim {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string fmt(double x, int prec = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, x);
  return buf;
}

struct line {
  std::string label;
  std::string color;
  std::vector<double> ys;
  /// Dashed (aggregates: a pool's mean or max), solid otherwise.
  bool dashed = false;
};

/// A vertical mark on the time axis: an event of the run (the fault timeline, a scale event).
/// Its label is a tooltip, and written beside the line when `labelled`.
struct marker {
  double x = 0;
  std::string label;
  std::string color;
  bool labelled = false;
};

/// Timeline events as markers: faults red, the cluster's recoveries (restarts, EP resizes,
/// recoveries, ends of slowdowns) green, instances staying down black, drain hand-offs orange.
std::vector<marker> timeline_markers(const nlohmann::json& r) {
  std::vector<marker> out;
  if (!r.contains("timeline"))
    return out;
  for (auto& e : r["timeline"]) {
    auto kind = e.value("kind", std::string{});
    auto color = kind == "restart" || kind == "ep_resize" || kind == "recover" || kind == "slow_end"
                   ? "#2ca02c"
                 : kind == "stays_down" ? "#000000"
                 : kind == "forward"    ? "#ff7f0e"
                                        : "#d62728";
    auto label = kind + " " + e.value("target", std::string{});
    if (e.contains("ep"))
      label += " (EP " + std::to_string(e["ep"].get<std::uint64_t>()) + ")";
    out.push_back({e.value("at_s", 0.0), std::move(label), color});
  }
  return out;
}

const char* const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

/// A line chart of `lines` over `xs` as an inline SVG with axes, ticks and a legend, and
/// `markers` drawn as dashed vertical lines.
std::string chart(const std::string& id, const std::string& title, const std::string& unit,
                  const std::vector<double>& xs, const std::vector<line>& lines,
                  const std::vector<marker>& markers = {}) {
  // The legend sits in rows of four under the x axis, so it never hides a line.
  const std::size_t per_row = 4;
  const auto legend_rows = (lines.size() + per_row - 1) / per_row;
  const double w = 640, plot_h = 240, left = 64, right = 16, top = 28, bottom = 36;
  const double h = plot_h + 16.0 * static_cast<double>(legend_rows) + (legend_rows > 0 ? 4 : 0);
  double xmax = xs.empty() ? 1 : std::max(1e-9, xs.back());
  for (auto& m : markers)
    xmax = std::max(xmax, m.x);
  double ymax = 0;
  for (auto& l : lines)
    for (auto y : l.ys)
      ymax = std::max(ymax, y);
  ymax = ymax > 0 ? ymax * 1.1 : 1;
  auto px = [&](double x) { return left + (w - left - right) * x / xmax; };
  auto py = [&](double y) { return plot_h - bottom - (plot_h - top - bottom) * y / ymax; };
  std::string svg = "<svg id=\"" + id + "\" class=\"chart\" viewBox=\"0 0 " + fmt(w, 0) + " "
                    + fmt(h, 0) + "\" width=\"" + fmt(w, 0) + "\" height=\"" + fmt(h, 0)
                    + "\" role=\"img\" aria-label=\"" + escape(title) + "\">";
  svg += "<text x=\"" + fmt(left, 0) + "\" y=\"18\" class=\"title\">" + escape(title) + " ("
         + escape(unit) + ")</text>";
  svg += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(plot_h - bottom) + "\" x2=\""
         + fmt(w - right) + "\" y2=\"" + fmt(plot_h - bottom) + "\" class=\"axis\"/>";
  svg += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(top) + "\" x2=\"" + fmt(left) + "\" y2=\""
         + fmt(plot_h - bottom) + "\" class=\"axis\"/>";
  for (int i = 0; i <= 4; ++i) {
    auto y = ymax * i / 4;
    svg += "<text x=\"" + fmt(left - 6) + "\" y=\"" + fmt(py(y) + 4) + "\" class=\"tick\" "
           "text-anchor=\"end\">" + fmt(y, y < 10 ? 2 : 0) + "</text>";
    auto x = xmax * i / 4;
    svg += "<text x=\"" + fmt(px(x)) + "\" y=\"" + fmt(plot_h - bottom + 16) + "\" class=\"tick\" "
           "text-anchor=\"middle\">" + fmt(x, 0) + " s</text>";
  }
  if (!markers.empty()) {
    svg += "<g class=\"markers\">";
    for (std::size_t i = 0; i < markers.size(); ++i) {
      auto& m = markers[i];
      auto x = px(std::min(std::max(0.0, m.x), xmax));
      svg += "<line class=\"marker\" x1=\"" + fmt(x) + "\" y1=\"" + fmt(top) + "\" x2=\"" + fmt(x)
             + "\" y2=\"" + fmt(plot_h - bottom) + "\" stroke=\"" + m.color
             + "\" stroke-width=\"1\" stroke-dasharray=\"2 2\"><title>" + fmt(m.x) + " s: "
             + escape(m.label) + "</title></line>";
      // Labels step down in three rows so that close events stay readable.
      if (m.labelled)
        svg += "<text x=\"" + fmt(x + 2) + "\" y=\"" + fmt(top + 8 + 11.0 * static_cast<double>(i % 3))
               + "\" class=\"tick\" fill=\"" + m.color + "\">" + escape(m.label) + "</text>";
    }
    svg += "</g>";
  }
  int n = 0;
  for (auto& l : lines) {
    std::string points;
    for (std::size_t i = 0; i < xs.size() && i < l.ys.size(); ++i)
      points += fmt(px(xs[i])) + "," + fmt(py(l.ys[i])) + " ";
    const std::string dash = l.dashed ? "\" stroke-dasharray=\"5 3" : "";
    svg += "<polyline class=\"series\" fill=\"none\" stroke=\"" + l.color + dash
           + "\" stroke-width=\"1.8\" points=\"" + points + "\"/>";
    auto lx = left + 140.0 * static_cast<double>(n % per_row);
    auto ly = plot_h + 16.0 * static_cast<double>(n / per_row);
    svg += "<line x1=\"" + fmt(lx) + "\" y1=\"" + fmt(ly - 4) + "\" x2=\"" + fmt(lx + 16)
           + "\" y2=\"" + fmt(ly - 4) + "\" stroke=\"" + l.color + dash
           + "\" stroke-width=\"2\"/>";
    svg += "<text x=\"" + fmt(lx + 20) + "\" y=\"" + fmt(ly) + "\" class=\"legend\">"
           + escape(l.label) + "</text>";
    ++n;
  }
  svg += "</svg>";
  return svg;
}

std::vector<double> numbers(const nlohmann::json& j) {
  std::vector<double> out;
  if (j.is_array())
    for (auto& x : j)
      out.push_back(x.get<double>());
  return out;
}

/// The instances of `pool` in a per-instance series object ("<pool>/<id>" keys), by id.
std::vector<std::pair<std::string, std::vector<double>>> pool_series(const nlohmann::json& obj,
                                                                     const std::string& pool) {
  std::vector<std::pair<std::uint64_t, std::pair<std::string, std::vector<double>>>> found;
  if (obj.is_object())
    for (auto& [key, v] : obj.items())
      if (key.size() > pool.size() && key.compare(0, pool.size() + 1, pool + "/") == 0)
        found.push_back({std::strtoull(key.c_str() + pool.size() + 1, nullptr, 10),
                         {key, numbers(v)}});
  std::sort(found.begin(), found.end(),
            [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<std::pair<std::string, std::vector<double>>> out;
  for (auto& f : found)
    out.push_back(std::move(f.second));
  return out;
}

/// Mean and max over instances, bin by bin.
std::pair<std::vector<double>, std::vector<double>>
mean_max(const std::vector<std::pair<std::string, std::vector<double>>>& xs) {
  std::vector<double> mean, max;
  for (auto& [k, v] : xs) {
    mean.resize(std::max(mean.size(), v.size()), 0.0);
    max.resize(std::max(max.size(), v.size()), 0.0);
    for (std::size_t i = 0; i < v.size(); ++i) {
      mean[i] += v[i] / static_cast<double>(xs.size());
      max[i] = std::max(max[i], v[i]);
    }
  }
  return {mean, max};
}

/// A pool's load lines: one per instance for a small pool; otherwise the busiest few
/// instances (by total) and the pool's mean, so a 1k-GPU topology keeps the page light.
std::vector<line> load_lines(const nlohmann::json& obj, const std::string& pool) {
  const std::size_t top_n = 4, all_up_to = 6;
  auto xs = pool_series(obj, pool);
  std::vector<line> out;
  if (xs.size() <= all_up_to) {
    for (std::size_t i = 0; i < xs.size(); ++i)
      out.push_back({xs[i].first, palette[i % 10], xs[i].second});
    return out;
  }
  std::vector<std::size_t> order(xs.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  auto total = [&](std::size_t i) {
    double s = 0;
    for (auto y : xs[i].second)
      s += y;
    return s;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return total(a) > total(b); });
  for (std::size_t k = 0; k < top_n; ++k)
    out.push_back({xs[order[k]].first, palette[k % 10], xs[order[k]].second});
  out.push_back({pool + " mean (" + std::to_string(xs.size()) + ")", "#333333",
                 mean_max(xs).first, true});
  return out;
}

/// Busy share lines over every pool: per instance when there are few, else each pool's mean
/// (solid) and max (dashed).
std::vector<line> busy_lines(const nlohmann::json& obj, const std::vector<std::string>& pools) {
  const std::size_t all_up_to = 8;
  std::vector<std::vector<std::pair<std::string, std::vector<double>>>> per_pool;
  std::size_t count = 0;
  for (auto& p : pools) {
    per_pool.push_back(pool_series(obj, p));
    count += per_pool.back().size();
  }
  std::vector<line> out;
  std::size_t c = 0;
  for (std::size_t i = 0; i < pools.size(); ++i) {
    if (count <= all_up_to) {
      for (auto& [k, v] : per_pool[i])
        out.push_back({k, palette[c++ % 10], v});
      continue;
    }
    if (per_pool[i].empty())
      continue;
    auto [mean, max] = mean_max(per_pool[i]);
    auto color = palette[c++ % 10];
    out.push_back({pools[i] + " mean", color, mean});
    out.push_back({pools[i] + " max", color, max, true});
  }
  return out;
}

std::string row(const std::string& k, const std::string& v) {
  return "<tr><th>" + escape(k) + "</th><td>" + escape(v) + "</td></tr>";
}

/// Instances per pool at each autoscaler decision (online, and the target it set), the scale
/// events marked on the time axis, and a table of the decisions that changed something.
std::string autoscaler_section(const nlohmann::json& a) {
  std::vector<double> xs;
  std::vector<std::string> pools;
  std::vector<std::vector<double>> online, target;
  std::vector<marker> marks;
  std::string rows;
  for (auto& d : a["decisions"]) {
    auto t = d["t_s"].get<double>();
    xs.push_back(t);
    std::size_t k = 0;
    for (auto& [pool, p] : d["pools"].items()) {
      if (k == pools.size()) {
        pools.push_back(pool);
        online.emplace_back();
        target.emplace_back();
      }
      online[k].push_back(p["online"].get<double>());
      target[k].push_back(p["target"].get<double>());
      auto up = p["up"].get<std::uint64_t>();
      auto down = p["down"].get<std::uint64_t>();
      if (up > 0)
        marks.push_back({t, "+" + std::to_string(up) + " " + pool, "#2ca02c", true});
      if (down > 0)
        marks.push_back({t, "-" + std::to_string(down) + " " + pool, "#d62728", true});
      if (up > 0 || down > 0)
        rows += "<tr><th>" + fmt(t) + " s</th><td>" + escape(pool) + ": "
                + escape(p["reason"].get<std::string>()) + " (occupancy "
                + fmt(d["occupancy"].get<double>() * 100) + "%)</td></tr>";
      ++k;
    }
  }
  std::vector<line> lines;
  for (std::size_t k = 0; k < pools.size(); ++k) {
    lines.push_back({pools[k] + " online", palette[k % 10], online[k]});
    lines.push_back({pools[k] + " target", palette[k % 10], target[k], true});
  }
  std::string out = "<h2>Autoscaler</h2>";
  out += chart("scale-instances", "Instances per pool (scale events marked)", "instances", xs, lines,
               marks);
  out += "<table id=\"scale-events\">" + rows + "</table>";
  return out;
}

} // namespace

std::string render_html(const nlohmann::json& r, const nlohmann::json& run) {
  auto& s = r["series"];
  auto xs = numbers(s["t_s"]);
  std::string body;
  body += "<h1>troupe simulation: " + escape(r["topology"].get<std::string>()) + "</h1>";
  body += "<p>" + escape(r["model"].get<std::string>()) + " on "
          + escape(r["hardware"].get<std::string>()) + ", seed "
          + std::to_string(r["seed"].get<std::uint64_t>()) + "</p>";
  body += "<table id=\"summary\">";
  auto& q = r["requests"];
  body += row("requests", std::to_string(q["admitted"].get<std::uint64_t>()) + " admitted, "
                            + std::to_string(q["completed"].get<std::uint64_t>()) + " completed, "
                            + std::to_string(q["failed"].get<std::uint64_t>()) + " failed");
  for (auto name : {"ttft", "tbt", "e2e"}) {
    auto& l = r["latency_ms"][name];
    body += row(std::string{name} + " (ms)", "p50 " + fmt(l["p50"].get<double>()) + ", p90 "
                                               + fmt(l["p90"].get<double>()) + ", p99 "
                                               + fmt(l["p99"].get<double>()));
  }
  body += row("throughput (tokens/s)",
              fmt(r["throughput"]["input_tokens_per_s"].get<double>(), 0) + " in, "
                + fmt(r["throughput"]["output_tokens_per_s"].get<double>(), 0) + " out");
  body += row("KV hit rate", "block " + fmt(r["kv"]["block_hit_rate"].get<double>() * 100)
                               + "%, token " + fmt(r["kv"]["token_hit_rate"].get<double>() * 100)
                               + "%");
  body += row("GPU busy share", fmt(r["gpus"]["busy_share"].get<double>() * 100) + "% of "
                                  + fmt(r["gpus"]["gpu_hours_held"].get<double>(), 2)
                                  + " GPU-hours held (" + std::to_string(r["gpus"]["total"].get<std::uint64_t>())
                                  + " GPUs at start)");
  body += row("output tokens per GPU-hour",
              fmt(r["gpus"]["output_tokens_per_gpu_hour"].get<double>(), 0));
  for (auto& [pool, p] : r["gpus"]["pools"].items())
    if (p.contains("batch_occupancy"))
      body += row(pool + " occupancy", "batch " + fmt(p["batch_occupancy"].get<double>() * 100)
                                         + "%, KV " + fmt(p["kv_occupancy"].get<double>() * 100)
                                         + "% (peak "
                                         + fmt(p["kv_occupancy_peak"].get<double>() * 100) + "%)");
  body += row("simulated", fmt(r["sim"]["virtual_s"].get<double>()) + " s virtual, "
                             + std::to_string(r["sim"]["events"].get<std::uint64_t>())
                             + " events");
  body += row("host", fmt(run["wall_s"].get<double>(), 2) + " s wall, "
                        + fmt(run["virtual_s_per_wall_s"].get<double>(), 0) + "x real time");
  body += "</table>";
  auto marks = timeline_markers(r);
  body += chart("throughput", "Throughput", "tokens/s", xs,
                {{"input", "#1f77b4", numbers(s["input_tokens_per_s"])},
                 {"output", "#d62728", numbers(s["output_tokens_per_s"])}},
                marks);
  body += chart("ttft", "Time to first token by arrival", "ms", xs,
                {{"p50", "#2ca02c", numbers(s["ttft_p50_ms"])},
                 {"p99", "#9467bd", numbers(s["ttft_p99_ms"])}},
                marks);
  body += chart("in-flight", "Requests in flight (queue length)", "requests", xs,
                {{"in flight", "#ff7f0e", numbers(s["requests_in_flight"])}}, marks);
  body += chart("hit-rate", "KV token hit rate by arrival", "fraction", xs,
                {{"token hit rate", "#17becf", numbers(s["token_hit_rate"])}}, marks);
  std::vector<std::string> pools;
  if (s.contains("pools"))
    for (auto& p : s["pools"])
      pools.push_back(p.get<std::string>());
  if (s.contains("instance_load"))
    for (auto& pool : pools)
      body += chart(pool + "-load", "Load per " + pool + " instance", "mean requests held", xs,
                    load_lines(s["instance_load"], pool), marks);
  if (s.contains("instance_busy"))
    body += chart("utilization", "Device busy share per instance", "fraction", xs,
                  busy_lines(s["instance_busy"], pools), marks);
  if (r.contains("timeline") && !r["timeline"].empty()) {
    // The fault timeline as a table too (report.json `timeline`).
    body += "<h2>Fault timeline</h2><table id=\"timeline\">";
    for (auto& e : r["timeline"]) {
      std::string what = e.value("target", std::string{});
      for (auto key : {"ep", "from", "to", "forwarded", "factor", "healthy_gpus"})
        if (e.contains(key))
          what += std::string{", "} + key + " " + e[key].dump();
      body += row(fmt(e.value("at_s", 0.0)) + " s " + e.value("kind", std::string{}), what);
    }
    body += "</table>";
  }
  if (r.contains("autoscaler"))
    body += autoscaler_section(r["autoscaler"]);
  body += "<h2>Load balancers</h2><table id=\"lb\">";
  if (r.contains("lb"))
    for (auto& [lb, counters] : r["lb"].items())
      for (auto& [k, v] : counters.items())
        body += row(lb + "." + k, std::to_string(v.get<std::uint64_t>()));
  body += "</table><h2>Busy share per instance (of the time it was up)</h2><table id=\"instances\">";
  for (auto& [k, v] : r["gpus"]["instance_busy_share"].items()) {
    auto u = v.get<double>();
    body += "<tr><th>" + escape(k) + "</th><td><svg width=\"200\" height=\"12\"><rect width=\""
            + fmt(200 * std::min(1.0, u)) + "\" height=\"12\" fill=\"#1f77b4\"/></svg> "
            + fmt(u * 100) + "%</td></tr>";
  }
  body += "</table>";
  return "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>troupe sim: "
         + escape(r["topology"].get<std::string>())
         + "</title><style>body{font-family:sans-serif;margin:24px;max-width:720px}"
           "table{border-collapse:collapse;margin:12px 0}th{text-align:left;padding:2px 12px 2px 0;"
           "font-weight:normal;color:#555}td{padding:2px 0}.chart{display:block;margin:16px 0}"
           ".axis{stroke:#888}.tick{font-size:10px;fill:#555}.title{font-size:13px}"
           ".legend{font-size:11px;fill:#333}</style></head><body>"
         + body + "</body></html>\n";
}

} // namespace troupe::cluster::sim

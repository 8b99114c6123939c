#include "cluster/sim/report_html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
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
};

/// A line chart of `lines` over `xs` as an inline SVG with axes, ticks and a legend.
std::string chart(const std::string& id, const std::string& title, const std::string& unit,
                  const std::vector<double>& xs, const std::vector<line>& lines) {
  const double w = 640, h = 240, left = 64, right = 16, top = 28, bottom = 36;
  double xmax = xs.empty() ? 1 : std::max(1e-9, xs.back());
  double ymax = 0;
  for (auto& l : lines)
    for (auto y : l.ys)
      ymax = std::max(ymax, y);
  ymax = ymax > 0 ? ymax * 1.1 : 1;
  auto px = [&](double x) { return left + (w - left - right) * x / xmax; };
  auto py = [&](double y) { return h - bottom - (h - top - bottom) * y / ymax; };
  std::string svg = "<svg id=\"" + id + "\" class=\"chart\" viewBox=\"0 0 " + fmt(w, 0) + " "
                    + fmt(h, 0) + "\" width=\"" + fmt(w, 0) + "\" height=\"" + fmt(h, 0)
                    + "\" role=\"img\" aria-label=\"" + escape(title) + "\">";
  svg += "<text x=\"" + fmt(left, 0) + "\" y=\"18\" class=\"title\">" + escape(title) + " ("
         + escape(unit) + ")</text>";
  svg += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(h - bottom) + "\" x2=\"" + fmt(w - right)
         + "\" y2=\"" + fmt(h - bottom) + "\" class=\"axis\"/>";
  svg += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(top) + "\" x2=\"" + fmt(left) + "\" y2=\""
         + fmt(h - bottom) + "\" class=\"axis\"/>";
  for (int i = 0; i <= 4; ++i) {
    auto y = ymax * i / 4;
    svg += "<text x=\"" + fmt(left - 6) + "\" y=\"" + fmt(py(y) + 4) + "\" class=\"tick\" "
           "text-anchor=\"end\">" + fmt(y, y < 10 ? 2 : 0) + "</text>";
    auto x = xmax * i / 4;
    svg += "<text x=\"" + fmt(px(x)) + "\" y=\"" + fmt(h - bottom + 16) + "\" class=\"tick\" "
           "text-anchor=\"middle\">" + fmt(x, 0) + " s</text>";
  }
  double legend_x = w - right - 160;
  int n = 0;
  for (auto& l : lines) {
    std::string points;
    for (std::size_t i = 0; i < xs.size() && i < l.ys.size(); ++i)
      points += fmt(px(xs[i])) + "," + fmt(py(l.ys[i])) + " ";
    svg += "<polyline class=\"series\" fill=\"none\" stroke=\"" + l.color
           + "\" stroke-width=\"1.8\" points=\"" + points + "\"/>";
    svg += "<text x=\"" + fmt(legend_x) + "\" y=\"" + fmt(top + 4 + 14.0 * n)
           + "\" class=\"legend\" fill=\"" + l.color + "\">" + escape(l.label) + "</text>";
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

std::string row(const std::string& k, const std::string& v) {
  return "<tr><th>" + escape(k) + "</th><td>" + escape(v) + "</td></tr>";
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
  body += row("GPU utilization", fmt(r["gpus"]["utilization"].get<double>() * 100) + "% of "
                                   + std::to_string(r["gpus"]["total"].get<std::uint64_t>()));
  body += row("simulated", fmt(r["sim"]["virtual_s"].get<double>()) + " s virtual, "
                             + std::to_string(r["sim"]["events"].get<std::uint64_t>())
                             + " events");
  body += row("host", fmt(run["wall_s"].get<double>(), 2) + " s wall, "
                        + fmt(run["virtual_s_per_wall_s"].get<double>(), 0) + "x real time");
  body += "</table>";
  body += chart("throughput", "Throughput", "tokens/s", xs,
                {{"input", "#1f77b4", numbers(s["input_tokens_per_s"])},
                 {"output", "#d62728", numbers(s["output_tokens_per_s"])}});
  body += chart("ttft", "Time to first token by arrival", "ms", xs,
                {{"p50", "#2ca02c", numbers(s["ttft_p50_ms"])},
                 {"p99", "#9467bd", numbers(s["ttft_p99_ms"])}});
  body += chart("in-flight", "Requests in flight (queue length)", "requests", xs,
                {{"in flight", "#ff7f0e", numbers(s["requests_in_flight"])}});
  body += chart("hit-rate", "KV token hit rate by arrival", "fraction", xs,
                {{"token hit rate", "#17becf", numbers(s["token_hit_rate"])}});
  body += "<h2>Load balancers</h2><table id=\"lb\">";
  if (r.contains("lb"))
    for (auto& [lb, counters] : r["lb"].items())
      for (auto& [k, v] : counters.items())
        body += row(lb + "." + k, std::to_string(v.get<std::uint64_t>()));
  body += "</table><h2>Utilization per instance</h2><table id=\"instances\">";
  for (auto& [k, v] : r["gpus"]["instance_utilization"].items()) {
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
           ".legend{font-size:11px}</style></head><body>"
         + body + "</body></html>\n";
}

} // namespace troupe::cluster::sim

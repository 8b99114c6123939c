// report_html: the self-contained HTML page of a simulation report.
//
// People read a run's report in a browser, often on a machine with no network, so the page
// carries everything inline: the summary tables and one SVG chart per series (throughput,
// TTFT percentiles, requests in flight, KV hit rate over virtual time; utilisation per
// instance). No script, no external asset.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace troupe::cluster::sim {

/// The HTML page for `report` (as written to report.json) and `run` (run.json).
std::string render_html(const nlohmann::json& report, const nlohmann::json& run);

} // namespace troupe::cluster::sim

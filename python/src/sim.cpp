// The simulator in troupe._core: `troupe sim` itself (run_sim_command, so a run from Python gives
// the report the CLI gives) and the fault swarm, with the GIL released while they run.
// troupe.sim (python/troupe/sim.py) turns the results into Python objects.
#include "bindings.hpp"

#include "cluster/sim/sim_command.hpp"
#include "cluster/sim/swarm.hpp"
#include "cluster/topology.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <toml++/toml.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace troupe::python {

namespace {

namespace sim = troupe::cluster::sim;

toml::table to_toml_table(nb::handle dict, const std::string& where);
toml::array to_toml_array(nb::handle list, const std::string& where);

// A TOML value from a Python value, handed to `put`: bool, int, float, str, dict (a table),
// list / tuple (an array). `where` names the key in errors. (Nested values recurse through the
// two functions above, so `put` is instantiated once for each of them.)
template <class Put>
void toml_value(nb::handle v, const std::string& where, Put&& put) {
  if (nb::isinstance<nb::bool_>(v)) put(nb::cast<bool>(v));
  else if (nb::isinstance<nb::int_>(v)) put(nb::cast<std::int64_t>(v));
  else if (nb::isinstance<nb::float_>(v)) put(nb::cast<double>(v));
  else if (nb::isinstance<nb::str>(v)) put(nb::cast<std::string>(v));
  else if (nb::isinstance<nb::dict>(v)) put(to_toml_table(v, where));
  else if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) put(to_toml_array(v, where));
  else
    throw nb::type_error(("topology" + where + ": a TOML value must be a bool, int, float, str, "
                          "dict or list, not " + nb::cast<std::string>(nb::str(v.type())))
                             .c_str());
}

toml::table to_toml_table(nb::handle dict, const std::string& where) {
  toml::table t;
  for (auto [k, x] : nb::borrow<nb::dict>(dict)) {
    const std::string key = nb::cast<std::string>(nb::str(k));
    toml_value(x, where + "." + key, [&](auto&& value) { t.insert(key, std::move(value)); });
  }
  return t;
}

toml::array to_toml_array(nb::handle list, const std::string& where) {
  toml::array a;
  std::size_t i = 0;
  for (nb::handle x : list)
    toml_value(x, where + "[" + std::to_string(i++) + "]", [&](auto&& value) { a.push_back(std::move(value)); });
  return a;
}

std::string toml_text(const nb::dict& d) {
  std::ostringstream os;
  os << to_toml_table(d, "") << "\n";
  return os.str();
}

// A topology from its TOML text (`name` labels the diagnostics); ValueError with every
// diagnostic when it is invalid.
cluster::topology parse(const std::string& text, const std::string& name) {
  auto loaded = cluster::parse_topology(text, name);
  if (!loaded.ok()) {
    std::string why;
    for (const auto& d : loaded.errors) why += (why.empty() ? "" : "\n") + d.to_string();
    throw nb::value_error(why.c_str());
  }
  return std::move(*loaded.value);
}

using seed_row = std::tuple<std::uint64_t, std::vector<std::string>, std::uint64_t, std::uint64_t>;

}  // namespace

void bind_sim(nb::module_& m) {
  m.def("toml_text", &toml_text, "table"_a, "A dict as TOML text (a topology written from Python).");

  m.def(
      "run_sim",
      [](const std::string& topology, const std::string& trace, const std::string& workload,
         double rate, const std::string& duration, double speedup, std::uint64_t seed,
         const std::string& until, std::optional<std::size_t> limit, const std::string& report_dir,
         bool strict, const std::string& faults, std::optional<std::uint64_t> swarm_seed) {
        sim::sim_command_options o;
        o.topology = topology;
        o.trace = trace;
        o.workload = workload;
        o.rate = rate;
        o.duration = duration;
        o.speedup = speedup;
        o.seed = seed;
        o.until = until;
        o.limit = limit;
        o.report_dir = report_dir;
        o.strict = strict;
        o.faults = faults;
        o.swarm_seed = swarm_seed;
        o.quiet = true;
        std::ostringstream out, err;
        int rc = 0;
        {
          nb::gil_scoped_release nogil;
          rc = sim::run_sim_command(o, out, err);
        }
        return std::make_tuple(rc, out.str(), err.str());
      },
      "topology"_a, "trace"_a, "workload"_a, "rate"_a, "duration"_a, "speedup"_a, "seed"_a,
      "until"_a, "limit"_a, "report_dir"_a, "strict"_a, "faults"_a, "swarm_seed"_a,
      "`troupe sim` with these options (quiet): its exit status, stdout and stderr.");

  m.def(
      "run_swarm",
      [](const std::string& text, const std::string& name, std::uint64_t first, std::uint64_t last,
         unsigned jobs) {
        if (first > last) throw nb::value_error("the first seed is after the last");
        const auto topo = parse(text, name);
        const std::uint64_t total = last - first + 1;
        std::vector<seed_row> rows(total);
        {
          nb::gil_scoped_release nogil;
          // As `troupe swarm`: each thread takes the next seed; the results do not depend on jobs.
          std::atomic<std::uint64_t> next{0};
          auto worker = [&] {
            for (std::uint64_t i; (i = next.fetch_add(1)) < total;) {
              auto r = sim::run_swarm_seed(topo, first + i);
              rows[i] = {r.seed, std::move(r.problems), r.requests, r.faults};
            }
          };
          const auto n = static_cast<unsigned>(std::min<std::uint64_t>(std::max(1u, jobs), total));
          std::vector<std::thread> threads;
          for (unsigned j = 1; j < n; ++j) threads.emplace_back(worker);
          worker();
          for (auto& t : threads) t.join();
        }
        return rows;
      },
      "topology_text"_a, "name"_a, "first"_a, "last"_a, "jobs"_a,
      "Runs swarm seeds first..last: (seed, problems, requests, faults) per seed.");
}

}  // namespace troupe::python

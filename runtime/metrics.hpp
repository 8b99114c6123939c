// A metrics registry (counters, gauges, histograms) rendered in the Prometheus text format.
//
// Every troupe process serves `/metrics`: request counts, queue depths, step latencies, KV hit
// rates. The registry holds metric *families* (a name, help text and label names); a family
// holds one *child* per set of label values, created on first use. Updating a child is a
// lock-free atomic (counters, gauges) or a short critical section (histograms), so any thread
// may update while another renders. `registry::expose()` renders the Prometheus text
// exposition format 0.0.4 with a deterministic order (families by name, children by label
// values), so its output can be compared byte for byte in tests. Invalid names and conflicting
// registrations are reported as `caf::error` values (category `metrics`), never thrown.
#pragma once

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/meta/type_name.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::runtime {

/// Why the registry refused a request. Errors carry the category `metrics_error_category` and
/// a context message (one std::string) naming the offending name or value.
enum class metrics_errc : std::uint8_t {
  invalid_metric_name = 1,   ///< not `[a-zA-Z_:][a-zA-Z0-9_:]*`
  invalid_label_name,        ///< not `[a-zA-Z_][a-zA-Z0-9_]*`, starts with `__`, or `le` on a
                             ///< histogram
  duplicate_label_name,      ///< the same label name twice in one family
  conflicting_registration,  ///< the name is taken by a family of another type, help, labels
                             ///< or buckets
  label_arity,               ///< label values given do not match the family's label names
  invalid_buckets,           ///< bucket bounds not strictly increasing, or NaN
};

/// The CAF error category of metrics errors.
inline constexpr caf::atom_value metrics_error_category = caf::atom("metrics");

/// The name of an error code, e.g. "invalid_metric_name".
std::string to_string(metrics_errc code);

/// A metrics error with `what` (one std::string) as its context.
caf::error make_error(metrics_errc code, std::string what);

/// A metrics error without context.
caf::error make_error(metrics_errc code);

/// True when `name` is a valid metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
bool is_valid_metric_name(std::string_view name) noexcept;

/// True when `name` is a valid label name: `[a-zA-Z_][a-zA-Z0-9_]*` and not starting with `__`
/// (reserved for Prometheus' internal labels).
bool is_valid_label_name(std::string_view name) noexcept;

/// Renders a sample value as the exposition format expects: `NaN`, `+Inf`, `-Inf`; integral
/// values below 2^53 in full without exponent ("3", "1000000"); others in the shortest form that
/// reads back exactly ("0.25", "1e+300").
std::string format_metric_value(double value);

/// A monotonically increasing value (requests served, tokens generated).
class counter {
public:
  /// Adds `amount`. Returns false and leaves the counter as it was when `amount` is negative
  /// or NaN (a counter never goes down).
  bool inc(double amount = 1.0) noexcept;

  /// The current value.
  double value() const noexcept;

private:
  std::atomic<double> value_{0.0};
};

/// A value that goes up and down (queue depth, free KV blocks).
class gauge {
public:
  /// Sets the value.
  void set(double value) noexcept;

  /// Adds `amount` (may be negative).
  void inc(double amount = 1.0) noexcept;

  /// Subtracts `amount`.
  void dec(double amount = 1.0) noexcept;

  /// The current value.
  double value() const noexcept;

private:
  std::atomic<double> value_{0.0};
};

/// Observations counted into fixed buckets (latencies, batch sizes). A bucket with upper bound
/// `le` counts observations `<= le`; the implicit last bucket (+Inf) counts all.
class histogram {
public:
  /// A consistent view of the histogram.
  struct snapshot {
    std::vector<double> bounds;              ///< the finite upper bounds, increasing
    std::vector<std::uint64_t> cumulative;   ///< bounds.size() + 1 counts; the last is +Inf
    double sum = 0.0;
    std::uint64_t count = 0;
  };

  /// A histogram over `bounds` (finite, strictly increasing: the family checked them).
  explicit histogram(std::vector<double> bounds);

  /// Counts `value` into the first bucket whose bound is >= value (+Inf when none) and adds it
  /// to the sum. A NaN lands in +Inf only, and makes the sum NaN.
  void observe(double value) noexcept;

  /// The current counts, sum and count, read under one lock.
  snapshot read() const;

private:
  mutable std::mutex mtx_;
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

/// The counter and gauge children of one family, as another process mirrors them
/// (metrics_mirror): `labels[i]` (in the order of `label_names`) has `values[i]`.
struct metric_samples {
  std::string name;
  std::string help;
  bool gauge = false;
  std::vector<std::string> label_names;
  std::vector<std::vector<std::string>> labels;
  std::vector<double> values;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, metric_samples& x) {
  return f(caf::meta::type_name("metric_samples"), x.name, x.help, x.gauge, x.label_names,
           x.labels, x.values);
}

/// The type of a family, as the `# TYPE` line names it.
enum class metric_type : std::uint8_t { counter, gauge, histogram };

/// What every family has: a name, help text and label names. Families live as long as their
/// registry; pointers to them (and to their children) stay valid until then.
class family_base {
public:
  family_base(metric_type type, std::string name, std::string help,
              std::vector<std::string> label_names);
  virtual ~family_base();

  family_base(const family_base&) = delete;
  family_base& operator=(const family_base&) = delete;

  metric_type type() const noexcept { return type_; }
  const std::string& name() const noexcept { return name_; }
  const std::string& help() const noexcept { return help_; }
  const std::vector<std::string>& label_names() const noexcept { return label_names_; }

  /// Appends this family's HELP, TYPE and sample lines to `out`; nothing when it has no child.
  virtual void render(std::string& out) const = 0;

private:
  metric_type type_;
  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
};

/// A family of `Metric` (counter, gauge or histogram): one child per set of label values.
template <class Metric>
class family final : public family_base {
public:
  family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds = {});

  /// The child for `label_values` (in the order of `label_names()`), created on first use;
  /// later calls with the same values return the same child. Error `label_arity` when the
  /// number of values differs from the number of label names. Thread-safe.
  caf::expected<Metric*> with(const std::vector<std::string>& label_values);

  /// The bucket bounds of a histogram family (empty for counters and gauges).
  const std::vector<double>& bounds() const noexcept { return bounds_; }

  /// Each child's label values and value, in label-value order (counters and gauges).
  void collect(metric_samples& out) const;

  void render(std::string& out) const override;

private:
  mutable std::mutex mtx_;
  std::vector<double> bounds_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_;
};

using counter_family = family<counter>;
using gauge_family = family<gauge>;
using histogram_family = family<histogram>;

/// The metric families of one process.
class registry {
public:
  registry() = default;
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  /// Registers a counter family, or returns the one already registered under `name` with the
  /// same help and label names. Errors: invalid_metric_name, invalid_label_name,
  /// duplicate_label_name, conflicting_registration. A family without labels gets its one
  /// child at once, so it is exposed (at 0) before its first update.
  caf::expected<counter_family*> add_counter(std::string name, std::string help,
                                             std::vector<std::string> label_names = {});

  /// As add_counter, for a gauge family.
  caf::expected<gauge_family*> add_gauge(std::string name, std::string help,
                                         std::vector<std::string> label_names = {});

  /// As add_counter, for a histogram family with the finite upper bounds `bucket_bounds`
  /// (strictly increasing; a trailing +Inf is dropped, +Inf is always implied). Further errors:
  /// invalid_buckets; invalid_label_name for a label named `le`.
  caf::expected<histogram_family*> add_histogram(std::string name, std::string help,
                                                 std::vector<double> bucket_bounds,
                                                 std::vector<std::string> label_names = {});

  /// Renders every family in the Prometheus text exposition format 0.0.4: families ordered by
  /// name, each as `# HELP` (when the help is not empty), `# TYPE`, then its samples ordered by
  /// label values; families without children are left out. Every line ends with '\n'.
  /// Thread-safe; values are read while other threads may update them.
  std::string expose() const;

  /// Every counter and gauge family with its children's values, families by name (histograms
  /// are left out). Thread-safe.
  std::vector<metric_samples> samples() const;

  /// Whether a family named `name` is registered.
  bool has(std::string_view name) const;

private:
  template <class Metric>
  caf::expected<family<Metric>*> add(metric_type type, std::string name, std::string help,
                                     std::vector<std::string> label_names,
                                     std::vector<double> bounds);

  mutable std::mutex mtx_;
  std::map<std::string, std::unique_ptr<family_base>, std::less<>> families_;
};

/// Shows other processes' counters and gauges in one registry (troupe launch: the control
/// process's /metrics holds its instance processes' device metrics). Each source (a process)
/// hands in its samples from time to time; a counter child grows by what the source's value
/// grew since its last samples (by the whole value when it went down: the source restarted),
/// so counters sum over sources and go on across a source's restarts; a gauge child is the sum
/// of the sources' latest values. A gauge family the registry had before the mirror saw it is
/// the registry's own and is left alone; a family whose help or labels conflict with the
/// registry's is skipped. Not thread-safe: one actor applies the samples.
class metrics_mirror {
public:
  explicit metrics_mirror(registry* reg) : reg_(reg) {}

  /// Applies source `source`'s samples.
  void apply(const std::string& source, const std::vector<metric_samples>& families);

  /// The source is gone: its gauges no longer count (its counters stay counted).
  void forget(const std::string& source);

private:
  using child_key = std::pair<std::string, std::vector<std::string>>;  // family, labels
  struct child_state {
    std::string help;
    std::vector<std::string> label_names;
    bool gauge = false;
    std::map<std::string, double> by_source;
  };
  void set_gauge(const child_key& key, const child_state& c);

  registry* reg_;
  std::map<child_key, child_state> children_;
  std::set<std::string> owned_;  // gauge families the registry had itself
  std::set<std::string> mirrored_;
};

/// The child with `label_values` of the gauge family `name` of `reg`, registering the family
/// (with `label_names`) if needed; null when `reg` is null or the registration fails (another
/// family of that name). For parts whose metrics are optional (the real world's ports).
gauge* gauge_child(registry* reg, std::string name, std::string help,
                   std::vector<std::string> label_names = {},
                   const std::vector<std::string>& label_values = {});

/// As gauge_child, for a counter family.
counter* counter_child(registry* reg, std::string name, std::string help,
                       std::vector<std::string> label_names = {},
                       const std::vector<std::string>& label_values = {});

} // namespace troupe::runtime

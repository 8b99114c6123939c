// The metrics registry and its Prometheus text rendering (see metrics.hpp).
#include "runtime/metrics.hpp"

#include <caf/make_message.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace troupe::runtime {

namespace {

bool is_name_start(char c, bool colon_ok) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_ok && c == ':');
}

bool is_name_char(char c, bool colon_ok) noexcept {
  return is_name_start(c, colon_ok) || (c >= '0' && c <= '9');
}

bool is_name(std::string_view name, bool colon_ok) noexcept {
  if (name.empty() || !is_name_start(name.front(), colon_ok))
    return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [=](char c) { return is_name_char(c, colon_ok); });
}

// HELP text escapes backslash and newline.
void append_help(std::string& out, std::string_view help) {
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
}

// Label values escape backslash, double quote and newline.
void append_label_value(std::string& out, std::string_view value) {
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
}

// `name{l1="v1",...,extra_name="extra_value"} value\n`; no braces without labels.
void append_sample(std::string& out, std::string_view name,
                   const std::vector<std::string>& label_names,
                   const std::vector<std::string>& label_values, double value,
                   std::string_view extra_name = {}, std::string_view extra_value = {}) {
  out += name;
  if (!label_names.empty() || !extra_name.empty()) {
    out += '{';
    bool first = true;
    auto label = [&](std::string_view n, std::string_view v) {
      if (!first)
        out += ',';
      first = false;
      out += n;
      out += "=\"";
      append_label_value(out, v);
      out += '"';
    };
    for (std::size_t i = 0; i < label_names.size(); ++i)
      label(label_names[i], label_values[i]);
    if (!extra_name.empty())
      label(extra_name, extra_value);
    out += '}';
  }
  out += ' ';
  out += format_metric_value(value);
  out += '\n';
}

void append_header(std::string& out, const family_base& f) {
  if (!f.help().empty()) {
    out += "# HELP ";
    out += f.name();
    out += ' ';
    append_help(out, f.help());
    out += '\n';
  }
  out += "# TYPE ";
  out += f.name();
  switch (f.type()) {
    case metric_type::counter:
      out += " counter\n";
      break;
    case metric_type::gauge:
      out += " gauge\n";
      break;
    case metric_type::histogram:
      out += " histogram\n";
      break;
  }
}

void atomic_add(std::atomic<double>& x, double amount) noexcept {
  x.fetch_add(amount, std::memory_order_relaxed);
}

} // namespace

// -- errors and names -------------------------------------------------------------------------

std::string to_string(metrics_errc code) {
  switch (code) {
    case metrics_errc::invalid_metric_name:
      return "invalid_metric_name";
    case metrics_errc::invalid_label_name:
      return "invalid_label_name";
    case metrics_errc::duplicate_label_name:
      return "duplicate_label_name";
    case metrics_errc::conflicting_registration:
      return "conflicting_registration";
    case metrics_errc::label_arity:
      return "label_arity";
    case metrics_errc::invalid_buckets:
      return "invalid_buckets";
  }
  return "unknown";
}

caf::error make_error(metrics_errc code, std::string what) {
  return caf::error{static_cast<std::uint8_t>(code), metrics_error_category,
                    caf::make_message(std::move(what))};
}

caf::error make_error(metrics_errc code) {
  return caf::error{static_cast<std::uint8_t>(code), metrics_error_category};
}

bool is_valid_metric_name(std::string_view name) noexcept {
  return is_name(name, true);
}

bool is_valid_label_name(std::string_view name) noexcept {
  return is_name(name, false) && !name.starts_with("__");
}

std::string format_metric_value(double value) {
  if (std::isnan(value))
    return "NaN";
  if (std::isinf(value))
    return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::to_chars_result res;
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0) // 2^53
    res = std::to_chars(buf, buf + sizeof(buf), static_cast<std::int64_t>(value));
  else
    res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

// -- counter, gauge, histogram ----------------------------------------------------------------

bool counter::inc(double amount) noexcept {
  if (!(amount >= 0.0))
    return false;
  atomic_add(value_, amount);
  return true;
}

double counter::value() const noexcept {
  return value_.load(std::memory_order_relaxed);
}

void gauge::set(double value) noexcept {
  value_.store(value, std::memory_order_relaxed);
}

void gauge::inc(double amount) noexcept {
  atomic_add(value_, amount);
}

void gauge::dec(double amount) noexcept {
  atomic_add(value_, -amount);
}

double gauge::value() const noexcept {
  return value_.load(std::memory_order_relaxed);
}

histogram::histogram(std::vector<double> bounds)
  : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
}

void histogram::observe(double value) noexcept {
  // lower_bound: the first bound not less than value, i.e. the first with value <= bound.
  auto bucket = std::isnan(value) ? bounds_.size()
                                  : static_cast<std::size_t>(
                                    std::lower_bound(bounds_.begin(), bounds_.end(), value)
                                    - bounds_.begin());
  std::lock_guard guard{mtx_};
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

histogram::snapshot histogram::read() const {
  snapshot result;
  result.bounds = bounds_;
  result.cumulative.reserve(counts_.size());
  std::lock_guard guard{mtx_};
  std::uint64_t total = 0;
  for (auto n : counts_) {
    total += n;
    result.cumulative.push_back(total);
  }
  result.sum = sum_;
  result.count = count_;
  return result;
}

// -- families ---------------------------------------------------------------------------------

family_base::family_base(metric_type type, std::string name, std::string help,
                         std::vector<std::string> label_names)
  : type_(type),
    name_(std::move(name)),
    help_(std::move(help)),
    label_names_(std::move(label_names)) {
}

family_base::~family_base() = default;

template <class Metric>
family<Metric>::family(std::string name, std::string help, std::vector<std::string> label_names,
                       std::vector<double> bounds)
  : family_base(std::is_same_v<Metric, counter> ? metric_type::counter
                : std::is_same_v<Metric, gauge> ? metric_type::gauge
                                                : metric_type::histogram,
                std::move(name), std::move(help), std::move(label_names)),
    bounds_(std::move(bounds)) {
}

template <class Metric>
caf::expected<Metric*> family<Metric>::with(const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names().size())
    return make_error(metrics_errc::label_arity,
                      name() + " takes " + std::to_string(label_names().size())
                        + " label values, got " + std::to_string(label_values.size()));
  std::lock_guard guard{mtx_};
  auto& child = children_[label_values];
  if (!child) {
    if constexpr (std::is_same_v<Metric, histogram>)
      child = std::make_unique<histogram>(bounds_);
    else
      child = std::make_unique<Metric>();
  }
  return child.get();
}

template <class Metric>
void family<Metric>::render(std::string& out) const {
  std::lock_guard guard{mtx_};
  if (children_.empty())
    return;
  append_header(out, *this);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<Metric, histogram>) {
      auto snap = child->read();
      for (std::size_t i = 0; i < snap.bounds.size(); ++i)
        append_sample(out, name() + "_bucket", label_names(), values,
                      static_cast<double>(snap.cumulative[i]), "le",
                      format_metric_value(snap.bounds[i]));
      append_sample(out, name() + "_bucket", label_names(), values,
                    static_cast<double>(snap.cumulative.back()), "le", "+Inf");
      append_sample(out, name() + "_sum", label_names(), values, snap.sum);
      append_sample(out, name() + "_count", label_names(), values,
                    static_cast<double>(snap.count));
    } else {
      append_sample(out, name(), label_names(), values, child->value());
    }
  }
}

template <class Metric>
void family<Metric>::collect(metric_samples& out) const {
  if constexpr (!std::is_same_v<Metric, histogram>) {
    std::lock_guard guard{mtx_};
    for (const auto& [values, child] : children_) {
      out.labels.push_back(values);
      out.values.push_back(child->value());
    }
  }
}

template class family<counter>;
template class family<gauge>;
template class family<histogram>;

// -- registry ---------------------------------------------------------------------------------

template <class Metric>
caf::expected<family<Metric>*>
registry::add(metric_type type, std::string name, std::string help,
              std::vector<std::string> label_names, std::vector<double> bounds) {
  if (!is_valid_metric_name(name))
    return make_error(metrics_errc::invalid_metric_name,
                      "invalid metric name \"" + name + "\"");
  for (std::size_t i = 0; i < label_names.size(); ++i) {
    const auto& label = label_names[i];
    if (!is_valid_label_name(label))
      return make_error(metrics_errc::invalid_label_name,
                        name + ": invalid label name \"" + label + "\"");
    if (type == metric_type::histogram && label == "le")
      return make_error(metrics_errc::invalid_label_name,
                        name + ": label name \"le\" is reserved in histograms");
    if (std::find(label_names.begin(), label_names.begin() + i, label)
        != label_names.begin() + i)
      return make_error(metrics_errc::duplicate_label_name,
                        name + ": label name \"" + label + "\" given twice");
  }
  if (!bounds.empty() && std::isinf(bounds.back()) && bounds.back() > 0)
    bounds.pop_back();
  for (std::size_t i = 0; i < bounds.size(); ++i)
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i - 1] < bounds[i])))
      return make_error(metrics_errc::invalid_buckets,
                        name + ": bucket bounds must be finite and strictly increasing");
  std::lock_guard guard{mtx_};
  if (auto i = families_.find(name); i != families_.end()) {
    auto* existing = dynamic_cast<family<Metric>*>(i->second.get());
    if (existing == nullptr || existing->help() != help
        || existing->label_names() != label_names || existing->bounds() != bounds)
      return make_error(metrics_errc::conflicting_registration,
                        name + " is already registered with another type, help, labels or "
                               "buckets");
    return existing;
  }
  auto created = std::make_unique<family<Metric>>(name, std::move(help), std::move(label_names),
                                                  std::move(bounds));
  auto* result = created.get();
  if (result->label_names().empty())
    static_cast<void>(result->with({}));
  families_.emplace(std::move(name), std::move(created));
  return result;
}

caf::expected<counter_family*> registry::add_counter(std::string name, std::string help,
                                                     std::vector<std::string> label_names) {
  return add<counter>(metric_type::counter, std::move(name), std::move(help),
                      std::move(label_names), {});
}

caf::expected<gauge_family*> registry::add_gauge(std::string name, std::string help,
                                                 std::vector<std::string> label_names) {
  return add<gauge>(metric_type::gauge, std::move(name), std::move(help),
                    std::move(label_names), {});
}

caf::expected<histogram_family*>
registry::add_histogram(std::string name, std::string help, std::vector<double> bucket_bounds,
                        std::vector<std::string> label_names) {
  return add<histogram>(metric_type::histogram, std::move(name), std::move(help),
                        std::move(label_names), std::move(bucket_bounds));
}

std::string registry::expose() const {
  std::string out;
  std::lock_guard guard{mtx_};
  for (const auto& [name, f] : families_)
    f->render(out);
  return out;
}

std::vector<metric_samples> registry::samples() const {
  std::vector<metric_samples> out;
  std::lock_guard guard{mtx_};
  for (const auto& [name, f] : families_) {
    if (f->type() == metric_type::histogram)
      continue;
    metric_samples s;
    s.name = name;
    s.help = f->help();
    s.gauge = f->type() == metric_type::gauge;
    s.label_names = f->label_names();
    if (s.gauge)
      static_cast<const gauge_family&>(*f).collect(s);
    else
      static_cast<const counter_family&>(*f).collect(s);
    out.push_back(std::move(s));
  }
  return out;
}

bool registry::has(std::string_view name) const {
  std::lock_guard guard{mtx_};
  return families_.find(name) != families_.end();
}

// -- metrics_mirror ---------------------------------------------------------------------------

void metrics_mirror::apply(const std::string& source, const std::vector<metric_samples>& families) {
  if (reg_ == nullptr)
    return;
  for (const auto& f : families) {
    if (f.labels.size() != f.values.size())
      continue;
    if (f.gauge && !mirrored_.count(f.name)) {
      if (owned_.count(f.name) || reg_->has(f.name)) {
        owned_.insert(f.name);
        continue;
      }
      mirrored_.insert(f.name);
    }
    for (std::size_t i = 0; i < f.labels.size(); ++i) {
      child_key key{f.name, f.labels[i]};
      auto& c = children_[key];
      c.help = f.help;
      c.label_names = f.label_names;
      c.gauge = f.gauge;
      auto [at, fresh] = c.by_source.try_emplace(source, 0.0);
      const double before = at->second;
      at->second = f.values[i];
      if (f.gauge) {
        set_gauge(key, c);
        continue;
      }
      const double grew = !fresh && f.values[i] >= before ? f.values[i] - before : f.values[i];
      if (auto fam = reg_->add_counter(f.name, f.help, f.label_names))
        if (auto child = (*fam)->with(f.labels[i]))
          (*child)->inc(grew);
    }
  }
}

void metrics_mirror::forget(const std::string& source) {
  for (auto& [key, c] : children_)
    if (c.by_source.erase(source) > 0 && c.gauge)
      set_gauge(key, c);
}

void metrics_mirror::set_gauge(const child_key& key, const child_state& c) {
  double sum = 0.0;
  for (const auto& [source, value] : c.by_source)
    sum += value;
  if (auto fam = reg_->add_gauge(key.first, c.help, c.label_names))
    if (auto child = (*fam)->with(key.second))
      (*child)->set(sum);
}

gauge* gauge_child(registry* reg, std::string name, std::string help,
                   std::vector<std::string> label_names,
                   const std::vector<std::string>& label_values) {
  if (reg == nullptr)
    return nullptr;
  auto f = reg->add_gauge(std::move(name), std::move(help), std::move(label_names));
  if (!f)
    return nullptr;
  auto g = (*f)->with(label_values);
  return g ? *g : nullptr;
}

counter* counter_child(registry* reg, std::string name, std::string help,
                       std::vector<std::string> label_names,
                       const std::vector<std::string>& label_values) {
  if (reg == nullptr)
    return nullptr;
  auto f = reg->add_counter(std::move(name), std::move(help), std::move(label_names));
  if (!f)
    return nullptr;
  auto c = (*f)->with(label_values);
  return c ? *c : nullptr;
}

} // namespace troupe::runtime

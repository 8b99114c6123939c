// fault_plan: loading, validation against a topology, and seeded expansion of fault plans.
#include "cluster/sim/fault_plan.hpp"

#include "cluster/toml_check.hpp"
#include "runtime/units.hpp"

#include <fmt/format.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

namespace troupe::cluster::sim {

std::string_view to_string(fault_kind kind) noexcept {
  switch (kind) {
    case fault_kind::fail:
      return "fail";
    case fault_kind::recover:
      return "recover";
    case fault_kind::slow:
      return "slow";
    case fault_kind::partition:
      return "partition";
    case fault_kind::drain:
      return "drain";
    case fault_kind::surge:
      return "surge";
    case fault_kind::store_fail:
      return "store_fail";
    case fault_kind::store_slow:
      return "store_slow";
  }
  return "?";
}

std::string_view to_string(target_kind kind) noexcept {
  switch (kind) {
    case target_kind::none:
      return "none";
    case target_kind::gpu:
      return "gpu";
    case target_kind::instance:
      return "instance";
    case target_kind::node:
      return "node";
    case target_kind::pool:
      return "pool";
    case target_kind::shard:
      return "shard";
    case target_kind::link:
      return "link";
  }
  return "?";
}

namespace {

std::string index_text(const std::optional<std::uint32_t>& i) {
  return *i == any_index ? std::string{"*"} : std::to_string(*i);
}

std::string place_text(const fault_place& p) {
  std::string out = p.pool;
  if (p.instance)
    out += "/" + index_text(p.instance);
  if (p.rank)
    out += "/" + index_text(p.rank);
  return out;
}

} // namespace

bool fault_target::has_wildcard() const noexcept {
  auto wild = [](const fault_place& p) {
    return (p.instance && *p.instance == any_index) || (p.rank && *p.rank == any_index);
  };
  return wild(place) || wild(peer);
}

std::string to_string(const fault_target& t) {
  switch (t.kind) {
    case target_kind::none:
      return "all traffic";
    case target_kind::gpu:
    case target_kind::instance:
    case target_kind::pool:
      return fmt::format("{} {}", to_string(t.kind), place_text(t.place));
    case target_kind::node:
      return "node " + t.node;
    case target_kind::shard:
      return fmt::format("shard {}", t.shard);
    case target_kind::link:
      return fmt::format("link {} <-> {}", place_text(t.place), place_text(t.peer));
  }
  return "?";
}

namespace {

using namespace toml_check;

const std::vector<std::string_view> kind_names{"fail",  "recover", "slow",       "partition",
                                               "drain", "surge",   "store_fail", "store_slow"};
const std::vector<std::string_view> target_keys{"gpu", "instance", "node", "pool", "shard", "link"};
const std::vector<std::string_view> entry_keys{"at",       "every",    "start", "jitter", "until",
                                               "kind",     "gpu",      "instance", "node", "pool",
                                               "shard",    "link",     "factor", "duration",
                                               "grace",    "note"};

constexpr double max_factor = 1000;
constexpr auto min_period = std::chrono::seconds{1};

fault_kind kind_of(std::string_view name) {
  for (std::size_t i = 0; i < kind_names.size(); ++i)
    if (kind_names[i] == name)
      return static_cast<fault_kind>(i);
  return fault_kind::fail;
}

target_kind target_of(std::string_view key) {
  for (std::size_t i = 0; i < target_keys.size(); ++i)
    if (target_keys[i] == key)
      return static_cast<target_kind>(i + 1);
  return target_kind::none;
}

/// The targets each kind accepts (empty: none, i.e. surge).
std::vector<target_kind> targets_for(fault_kind k) {
  using t = target_kind;
  switch (k) {
    case fault_kind::fail:
      return {t::gpu, t::instance, t::node, t::pool};
    case fault_kind::recover:
      return {t::gpu, t::instance, t::node, t::pool, t::shard};
    case fault_kind::slow:
      return {t::gpu, t::instance, t::node, t::pool, t::link};
    case fault_kind::partition:
      return {t::link, t::instance, t::node, t::pool};
    case fault_kind::drain:
      return {t::instance};
    case fault_kind::surge:
      return {};
    case fault_kind::store_fail:
    case fault_kind::store_slow:
      return {t::shard};
  }
  return {};
}

std::string target_list(fault_kind k) {
  std::vector<std::string_view> names;
  for (auto t : targets_for(k))
    names.push_back(to_string(t));
  return join_list(names);
}

bool needs_factor(fault_kind k) {
  return k == fault_kind::slow || k == fault_kind::store_slow || k == fault_kind::surge;
}

enum class need { required, optional, forbidden };

need duration_need(fault_kind k) {
  switch (k) {
    case fault_kind::slow:
    case fault_kind::partition:
    case fault_kind::surge:
    case fault_kind::store_slow:
      return need::required;
    case fault_kind::fail:
    case fault_kind::store_fail:
      return need::optional;
    case fault_kind::recover:
    case fault_kind::drain:
      return need::forbidden;
  }
  return need::forbidden;
}

std::vector<std::string_view> pool_names(const topology& topo) {
  std::vector<std::string_view> names;
  for (const auto& p : topo.pools)
    names.push_back(p.name);
  return names;
}

const pool_spec* find_pool(const topology& topo, std::string_view name) {
  for (const auto& p : topo.pools)
    if (p.name == name)
      return &p;
  return nullptr;
}

/// Reads one entry; records diagnostics and returns nullopt when anything in it is wrong.
class entry_reader {
public:
  entry_reader(checker& c, const topology& topo, const fault_limits& limits)
    : c_(c), topo_(topo), limits_(limits) {
  }

  std::optional<fault_entry> read(const toml::table& tbl, const std::string& path) {
    ok_ = true;
    path_ = path;
    fault_entry e;
    e.line = tbl.source().begin.line;
    c_.check_keys(tbl, path, entry_keys);
    for (auto&& [k, v] : tbl)
      if (std::find(entry_keys.begin(), entry_keys.end(), k.str()) == entry_keys.end())
        ok_ = false;

    auto kind = c_.choice(tbl, path, "kind", kind_names, "fault kind", true,
                          "add e.g. kind = \"fail\"; kinds: " + join_list(kind_names));
    if (!kind)
      ok_ = false;
    else
      e.kind = kind_of(*kind);

    read_time(tbl, e);
    if (kind) {
      read_target(tbl, e);
      read_factor(tbl, e);
      read_duration(tbl, e);
      read_grace(tbl, e);
    }
    if (tbl.get("note") != nullptr) {
      if (auto n = c_.string(tbl, path, "note", false))
        e.note = *n;
      else
        ok_ = false;
    }
    if (!ok_)
      return std::nullopt;
    return e;
  }

private:
  void error(const toml::node& n, std::string_view key, std::string message,
             std::string hint = {}) {
    c_.error(n.source(), join_path(path_, key), std::move(message), std::move(hint));
    ok_ = false;
  }

  std::optional<runtime::duration> dur(const toml::table& tbl, std::string_view key,
                                       bool allow_zero) {
    if (tbl.get(key) == nullptr)
      return std::nullopt;
    auto d = c_.duration(tbl, path_, key, allow_zero);
    if (!d)
      ok_ = false;
    return d;
  }

  void read_time(const toml::table& tbl, fault_entry& e) {
    const auto* at_node = tbl.get("at");
    const auto* every_node = tbl.get("every");
    auto at = dur(tbl, "at", true);
    auto every = dur(tbl, "every", false);
    if (at_node == nullptr && every_node == nullptr) {
      c_.missing(tbl, path_, "at",
                 "add at = \"5min\" for one fault, or every = \"10min\" to repeat it");
      ok_ = false;
      return;
    }
    if (at_node != nullptr && every_node != nullptr) {
      error(*every_node, "every", "'at' and 'every' exclude each other",
            "at is one fault, every repeats it; write start = ... for the first occurrence");
      return;
    }
    if (at_node != nullptr) {
      for (auto key : {"start", "jitter", "until"})
        if (const auto* n = tbl.get(key))
          error(*n, key, "applies only to periodic entries",
                "write every = \"10min\" instead of at, or remove it");
      if (at)
        e.at = *at;
      return;
    }
    if (!every)
      return;
    if (*every < min_period) {
      error(*every_node, "every",
            fmt::format("a period of {} is too short", runtime::format_duration(*every)),
            "periods start at 1s; shorter ones would flood the run");
      return;
    }
    e.every = *every;
    e.at = *every;
    if (auto start = dur(tbl, "start", true))
      e.at = *start;
    if (auto jitter = dur(tbl, "jitter", true)) {
      if (*jitter * 2 > *every)
        error(*tbl.get("jitter"), "jitter",
              fmt::format("jitter ({}) is more than half the period ({})",
                          runtime::format_duration(*jitter), runtime::format_duration(*every)),
              "occurrences must stay in order: use jitter <= every / 2");
      else
        e.jitter = *jitter;
    }
    if (auto until = dur(tbl, "until", false)) {
      if (*until < e.at)
        error(*tbl.get("until"), "until",
              fmt::format("until ({}) is before the first occurrence ({})",
                          runtime::format_duration(*until), runtime::format_duration(e.at)),
              "until is the time of the last possible occurrence");
      else
        e.until = *until;
    }
  }

  // An index: digits or '*'; `count` is the exclusive bound, `what` names it in messages.
  std::optional<std::uint32_t> index(const toml::node& n, std::string_view key,
                                     std::string_view part, std::string_view what,
                                     std::uint64_t count, std::string_view bound_text) {
    if (part == "*")
      return any_index;
    bool digits = !part.empty() && part.size() <= 9
                  && std::all_of(part.begin(), part.end(),
                                 [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits) {
      error(n, key, fmt::format("{} '{}' is not an index", what, part),
            "write a number from 0, or '*' for one drawn from the seed");
      return std::nullopt;
    }
    auto v = static_cast<std::uint64_t>(std::stoul(std::string(part)));
    if (v >= count) {
      error(n, key, fmt::format("{} {} does not exist: {}", what, v, bound_text),
            count == 0 ? std::string{"there is none to target"}
                       : fmt::format("{} indices run from 0 to {}", what, count - 1));
      return std::nullopt;
    }
    return static_cast<std::uint32_t>(v);
  }

  // A place `pool[/instance[/rank]]` written in the string node `n`, with `min_parts` to
  // `max_parts` parts; `form` and `example` shape the message for a wrong form.
  std::optional<fault_place> place(const toml::node& n, std::string_view key,
                                   std::size_t min_parts, std::size_t max_parts,
                                   std::string_view form, std::string_view example) {
    auto* s = n.as_string();
    if (s == nullptr) {
      c_.wrong_type(n, join_path(path_, key), "a string", fmt::format("write e.g. {}", example));
      ok_ = false;
      return std::nullopt;
    }
    std::vector<std::string> parts;
    std::string text = s->get();
    std::size_t from = 0;
    for (;;) {
      auto slash = text.find('/', from);
      parts.push_back(text.substr(from, slash == std::string::npos ? slash : slash - from));
      if (slash == std::string::npos)
        break;
      from = slash + 1;
    }
    if (parts.size() < min_parts || parts.size() > max_parts
        || std::any_of(parts.begin(), parts.end(), [](auto& p) { return p.empty(); })) {
      error(n, key, fmt::format("expected '{}', got '{}'", form, text),
            fmt::format("write e.g. {}; an index may be '*' (drawn from the seed)", example));
      return std::nullopt;
    }
    fault_place p;
    p.pool = parts[0];
    const auto* pool = find_pool(topo_, p.pool);
    if (pool == nullptr) {
      error(n, key, fmt::format("pool '{}' does not exist", p.pool),
            suggestion(p.pool, pool_names(topo_)));
      return std::nullopt;
    }
    p.initial_instances = pool->instances.initial;
    p.gpus_per_instance = pool->gpus_per_instance;
    if (parts.size() >= 2) {
      auto i = index(n, key, parts[1], "instance", pool->instances.max,
                     fmt::format("pool '{}' has at most {} instances", pool->name,
                                 pool->instances.max));
      if (!i)
        return std::nullopt;
      if (*i == any_index && pool->instances.initial == 0) {
        error(n, key,
              fmt::format("pool '{}' starts with no instances, so '*' has none to draw from",
                          pool->name),
              "name an instance index instead");
        return std::nullopt;
      }
      p.instance = *i;
    }
    if (parts.size() >= 3) {
      auto r = index(n, key, parts[2], "rank", pool->gpus_per_instance,
                     fmt::format("instances of pool '{}' have {} GPUs", pool->name,
                                 pool->gpus_per_instance));
      if (!r)
        return std::nullopt;
      p.rank = *r;
    }
    return p;
  }

  void read_target(const toml::table& tbl, fault_entry& e) {
    const toml::node* target_node = nullptr;
    std::string_view target_key;
    for (auto&& [k, v] : tbl) {
      if (target_of(k.str()) == target_kind::none)
        continue;
      if (target_node != nullptr) {
        error(v, k.str(),
              fmt::format("a fault has one target, but this entry names both '{}' and '{}'",
                          target_key, k.str()),
              "split it into two [[fault]] entries");
        return;
      }
      target_node = &v;
      target_key = k.str();
    }
    auto allowed = targets_for(e.kind);
    auto kind_name = to_string(e.kind);
    if (target_node == nullptr) {
      if (allowed.empty())
        return;
      c_.missing(tbl, path_, "target",
                 fmt::format("kind '{}' needs one of: {}", kind_name, target_list(e.kind)));
      ok_ = false;
      return;
    }
    auto tk = target_of(target_key);
    if (std::find(allowed.begin(), allowed.end(), tk) == allowed.end()) {
      std::string hint;
      if (allowed.empty())
        hint = "a surge multiplies the whole workload's traffic: remove the target";
      else if (tk == target_kind::shard)
        hint = fmt::format("store shards take kind = \"store_{}\"",
                           e.kind == fault_kind::slow ? "slow" : "fail");
      else
        hint = fmt::format("kind '{}' targets: {}", kind_name, target_list(e.kind));
      error(*target_node, target_key,
            fmt::format("kind '{}' cannot target a {}", kind_name, target_key), std::move(hint));
      return;
    }
    e.target.kind = tk;
    switch (tk) {
      case target_kind::gpu:
        if (auto p = place(*target_node, target_key, 3, 3, "pool/instance/rank",
                           "gpu = \"decode/0/3\""))
          e.target.place = *p;
        break;
      case target_kind::instance:
        if (auto p = place(*target_node, target_key, 2, 2, "pool/instance",
                           "instance = \"decode/1\""))
          e.target.place = *p;
        break;
      case target_kind::pool:
        if (auto p = place(*target_node, target_key, 1, 1, "pool", "pool = \"prefill\""))
          e.target.place = *p;
        break;
      case target_kind::node:
        read_node(*target_node, e);
        break;
      case target_kind::shard: {
        auto v = c_.integer_node(*target_node, join_path(path_, "shard"), 0,
                                 std::numeric_limits<std::int64_t>::max());
        if (!v) {
          ok_ = false;
        } else if (static_cast<std::uint64_t>(*v) >= limits_.store_shards) {
          error(*target_node, "shard",
                fmt::format("shard {} does not exist: the KV store has {} shards", *v,
                            limits_.store_shards),
                fmt::format("shard indices run from 0 to {}", limits_.store_shards - 1));
        } else {
          e.target.shard = static_cast<std::uint32_t>(*v);
        }
        break;
      }
      case target_kind::link:
        read_link(*target_node, e);
        break;
      case target_kind::none:
        break;
    }
    if (e.kind == fault_kind::drain && ok_) {
      const auto* pool = find_pool(topo_, e.target.place.pool);
      if (pool->role != pool_role::decode && pool->role != pool_role::prefill) {
        error(*target_node, target_key,
              fmt::format("drain applies only to prefill and decode instances, and pool '{}' "
                          "is a {} pool",
                          pool->name, to_string(pool->role)),
              "target an instance of a prefill or decode pool, or use kind = \"fail\"");
        return;
      }
      e.grace = pool->grace;
    }
  }

  void read_node(const toml::node& n, fault_entry& e) {
    auto* s = n.as_string();
    if (s == nullptr) {
      c_.wrong_type(n, join_path(path_, "node"), "a string", "write e.g. node = \"node-0\"");
      ok_ = false;
      return;
    }
    std::vector<std::string_view> names;
    for (const auto& node : topo_.nodes) {
      if (node.name == s->get()) {
        e.target.node = node.name;
        return;
      }
      names.push_back(node.name);
    }
    if (names.empty())
      error(n, "node",
            fmt::format("node '{}' does not exist: the topology has no [[node]] sections",
                        s->get()),
            "the simulated world places pools itself; target an instance or a gpu instead");
    else
      error(n, "node", fmt::format("node '{}' does not exist", s->get()),
            suggestion(s->get(), names));
  }

  void read_link(const toml::node& n, fault_entry& e) {
    auto* arr = n.as_array();
    const char* example = "link = [\"prefill/0\", \"decode\"]";
    if (arr == nullptr || arr->size() != 2) {
      if (arr == nullptr)
        c_.wrong_type(n, join_path(path_, "link"), "an array of two places",
                      fmt::format("write e.g. {}", example));
      else
        c_.error(n.source(), join_path(path_, "link"),
                 fmt::format("a link joins two places, got {}", arr->size()),
                 fmt::format("write e.g. {}", example));
      ok_ = false;
      return;
    }
    auto a = place(*arr->get(0), "link[0]", 1, 2, "pool or pool/instance", example);
    auto b = place(*arr->get(1), "link[1]", 1, 2, "pool or pool/instance", example);
    if (!a || !b)
      return;
    if (place_text(*a) == place_text(*b) && place_text(*a).find('*') == std::string::npos) {
      error(n, "link", fmt::format("both ends of the link are '{}'", place_text(*a)),
            "a link joins two different instances or pools");
      return;
    }
    e.target.place = *a;
    e.target.peer = *b;
  }

  void read_factor(const toml::table& tbl, fault_entry& e) {
    const auto* n = tbl.get("factor");
    if (!needs_factor(e.kind)) {
      if (n != nullptr)
        error(*n, "factor",
              fmt::format("does not apply to kind '{}'", to_string(e.kind)),
              "factor belongs to slow, store_slow and surge");
      return;
    }
    if (n == nullptr) {
      c_.missing(tbl, path_, "factor",
                 e.kind == fault_kind::surge
                   ? "add e.g. factor = 3 (three times the traffic)"
                   : "add e.g. factor = 2 (everything takes twice as long)");
      ok_ = false;
      return;
    }
    auto v = c_.number(tbl, path_, "factor", 1, max_factor, true,
                       e.kind == fault_kind::surge
                         ? "a traffic multiplier: 3 makes three times the arrivals"
                         : "a slowdown: 2 makes everything take twice as long");
    if (!v)
      ok_ = false;
    else
      e.factor = *v;
  }

  void read_duration(const toml::table& tbl, fault_entry& e) {
    const auto* n = tbl.get("duration");
    auto need = duration_need(e.kind);
    if (need == need::forbidden) {
      if (n != nullptr)
        error(*n, "duration", fmt::format("does not apply to kind '{}'", to_string(e.kind)),
              e.kind == fault_kind::drain ? "a drain lasts its pool's grace; write grace = ..."
                                          : "a recovery is instant; remove it");
      return;
    }
    if (n == nullptr) {
      if (need == need::required) {
        c_.missing(tbl, path_, "duration",
                   fmt::format("kind '{}' lasts a while: add e.g. duration = \"2min\"",
                               to_string(e.kind)));
        ok_ = false;
      }
      return;
    }
    e.duration = dur(tbl, "duration", false);
  }

  void read_grace(const toml::table& tbl, fault_entry& e) {
    const auto* n = tbl.get("grace");
    if (n == nullptr)
      return;
    if (e.kind != fault_kind::drain) {
      error(*n, "grace", fmt::format("does not apply to kind '{}'", to_string(e.kind)),
            "grace belongs to drain");
      return;
    }
    if (auto g = dur(tbl, "grace", false))
      e.grace = *g;
  }

  checker& c_;
  const topology& topo_;
  const fault_limits& limits_;
  std::string path_;
  bool ok_ = true;
};

} // namespace

fault_plan_result parse_fault_plan(std::string_view text, std::string_view file_name,
                                   const topology& topo, const fault_limits& limits) {
  fault_plan_result result;
  checker c{std::string(file_name)};
  toml::table root;
  try {
    root = toml::parse(text, file_name);
  } catch (const toml::parse_error& e) {
    c.error(e.source(), "", fmt::format("TOML syntax error: {}", e.description()));
    result.errors = c.take_errors();
    return result;
  }
  fault_plan plan;
  plan.source = std::string(file_name);
  c.check_keys(root, "", {"name", "fault"});
  if (root.get("name") != nullptr)
    if (auto n = c.string(root, "", "name", false))
      plan.name = *n;
  auto* n = root.get("fault");
  if (n == nullptr) {
    c.missing(root, "", "fault", "add [[fault]] entries with a time, a target and a kind");
  } else if (auto* arr = n->as_array(); arr == nullptr || !arr->is_array_of_tables()
                                        || arr->empty()) {
    c.wrong_type(*n, "fault", "an array of tables",
                 "write [[fault]] (double brackets) before each fault");
  } else {
    entry_reader reader{c, topo, limits};
    for (std::size_t i = 0; i < arr->size(); ++i)
      if (auto e = reader.read(*arr->get(i)->as_table(), fmt::format("fault[{}]", i)))
        plan.entries.push_back(std::move(*e));
  }
  if (c.failed()) {
    result.errors = c.take_errors();
    return result;
  }
  result.value = std::move(plan);
  return result;
}

fault_plan_result load_fault_plan(const std::filesystem::path& file, const topology& topo,
                                  const fault_limits& limits) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    fault_plan_result result;
    diagnostic d;
    d.file = file.string();
    d.line = 1;
    d.column = 1;
    d.message = "cannot read the file";
    d.hint = std::filesystem::exists(file) ? "check its permissions" : "no such file";
    result.errors.push_back(std::move(d));
    return result;
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_fault_plan(text.str(), file.string(), topo, limits);
}

namespace {

// Draws the '*' indices of a place: instances among the pool's initial ones (those that
// exist when the run starts), ranks among the instance's GPUs.
void resolve(fault_place& p, runtime::rng& r) {
  if (p.instance && *p.instance == any_index)
    p.instance = static_cast<std::uint32_t>(r.below(p.initial_instances));
  if (p.rank && *p.rank == any_index)
    p.rank = static_cast<std::uint32_t>(r.below(p.gpus_per_instance));
}

} // namespace

std::vector<fault> expand(const fault_plan& plan, const runtime::rng& random,
                          runtime::duration horizon) {
  struct keyed {
    fault f;
    std::uint64_t occurrence;
  };
  std::vector<keyed> out;
  for (std::size_t i = 0; i < plan.entries.size(); ++i) {
    const auto& e = plan.entries[i];
    auto r = random.split("fault", i);
    auto make = [&](runtime::duration at) {
      fault f;
      f.at = at;
      f.kind = e.kind;
      f.target = e.target;
      resolve(f.target.place, r);
      resolve(f.target.peer, r);
      f.factor = e.factor;
      f.duration = e.duration;
      f.grace = e.grace;
      f.entry = i;
      f.line = e.line;
      f.note = e.note;
      return f;
    };
    auto last = e.until ? std::min(*e.until, horizon) : horizon;
    if (!e.every) {
      if (e.at <= horizon)
        out.push_back({make(e.at), 0});
      continue;
    }
    std::uint64_t k = 0;
    for (auto base = e.at; base <= last; base += *e.every, ++k) {
      auto at = base;
      if (e.jitter.count() > 0) {
        auto j = r.between(-e.jitter.count(), e.jitter.count());
        at = base + runtime::duration{j};
        if (at.count() < 0)
          at = runtime::duration{0};
      }
      auto f = make(at); // draws the wildcards even when the occurrence is dropped
      if (at > last)
        continue;
      out.push_back({std::move(f), k});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const keyed& a, const keyed& b) {
    return std::tie(a.f.at, a.f.entry, a.occurrence) < std::tie(b.f.at, b.f.entry, b.occurrence);
  });
  std::vector<fault> timeline;
  timeline.reserve(out.size());
  for (auto& k : out)
    timeline.push_back(std::move(k.f));
  return timeline;
}

nlohmann::json to_json(const std::vector<fault>& timeline) {
  auto seconds = [](runtime::duration d) { return runtime::to_seconds(d); };
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : timeline) {
    nlohmann::json j;
    j["at_s"] = seconds(f.at);
    j["kind"] = to_string(f.kind);
    j["target"] = to_string(f.target);
    if (needs_factor(f.kind))
      j["factor"] = f.factor;
    if (f.duration)
      j["duration_s"] = seconds(*f.duration);
    if (f.kind == fault_kind::drain)
      j["grace_s"] = seconds(f.grace);
    j["line"] = f.line;
    if (!f.note.empty())
      j["note"] = f.note;
    out.push_back(std::move(j));
  }
  return out;
}

} // namespace troupe::cluster::sim

// Topology files: loading, validation and the normalized description.
#include "cluster/topology.hpp"

#include "cluster/toml_check.hpp"

#include "runtime/units.hpp"

#include <fmt/format.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <tuple>
#include <utility>

namespace troupe::cluster {

std::string_view to_string(pool_role role) noexcept {
  switch (role) {
    case pool_role::prefill:
      return "prefill";
    case pool_role::decode:
      return "decode";
    case pool_role::vision:
      return "vision";
  }
  return "?";
}

std::string_view to_string(storage_backend backend) noexcept {
  switch (backend) {
    case storage_backend::sim:
      return "sim";
    case storage_backend::posix:
      return "posix";
  }
  return "?";
}

const std::vector<std::string_view>& known_models() {
  static const std::vector<std::string_view> models{"deepseek-v4.1-flash", "deepseek-v4-flash",
                                                    "deepseek-v3"};
  return models;
}

const std::vector<std::string_view>& known_hardware() {
  static const std::vector<std::string_view> hardware{"H800", "H100",      "H200",
                                                      "B200", "Ascend950", "cpu"};
  return hardware;
}

namespace {

using namespace toml_check;

std::string format_tokens(std::uint64_t n) {
  if (n >= 1024 * 1024 && n % (1024 * 1024) == 0)
    return fmt::format("{}M", n / (1024 * 1024));
  if (n >= 1024 && n % 1024 == 0)
    return fmt::format("{}K", n / 1024);
  return std::to_string(n);
}

// -- limits and names -------------------------------------------------------------------------

constexpr std::uint32_t max_gpus_per_instance = 65536;
constexpr std::uint32_t max_instances = 1'000'000;
// Whole-cluster limits at the pools' max sizes (docs/topology.md, "Limits"): far above any
// deployment (an internet-scale cluster is ~10,000 GPUs), and low enough that a simulation
// of the whole cluster fits in one machine's memory.
constexpr std::uint64_t max_cluster_gpus = 1u << 20;
constexpr std::uint64_t max_cluster_instances = 65536;

const std::vector<std::string_view> role_names{"prefill", "decode", "vision"};
const std::vector<std::string_view> backend_names{"sim", "posix"};

// -- sections ---------------------------------------------------------------------------------

void read_cluster(checker& c, const toml::table& root, topology& t) {
  auto* tbl = c.table(root, "", "cluster", true,
                      "add a [cluster] section with name, model and hardware");
  if (tbl == nullptr)
    return;
  c.check_keys(*tbl, "cluster", {"name", "model", "hardware", "device"});
  if (auto name = c.string(*tbl, "cluster", "name", true, "add e.g. name = \"my-cluster\""))
    t.cluster.name = *name;
  if (auto m = c.choice(*tbl, "cluster", "model", known_models(), "model", true,
                        "add e.g. model = \"deepseek-v4.1-flash\""))
    t.cluster.model = *m;
  if (auto h = c.choice(*tbl, "cluster", "hardware", known_hardware(), "hardware", true,
                        "add e.g. hardware = \"H800\""))
    t.cluster.hardware = *h;
  const auto& hw = t.cluster.hardware;
  const bool nvidia = hw == "H800" || hw == "H100" || hw == "H200" || hw == "B200";
  t.cluster.device = t.cluster.hardware == "cpu" ? "cpu" : nvidia ? "cuda" : "";
  if (auto d = c.choice(*tbl, "cluster", "device", {"cpu", "cuda"}, "device", false)) {
    if (*d == "cuda" && !nvidia && !t.cluster.hardware.empty())
      c.error(tbl->get("device")->source(), "cluster.device",
              "device \"cuda\" needs NVIDIA hardware, not " + t.cluster.hardware,
              "use hardware = \"H100\", \"H200\", \"H800\" or \"B200\", or device = \"cpu\"");
    t.cluster.device = *d;
  }
}

void read_storage(checker& c, const toml::table& root, topology& t) {
  auto* tbl = c.table(root, "", "storage", true,
                      "add a [storage] section with backend and capacity");
  if (tbl == nullptr)
    return;
  const std::string p = "storage";
  c.check_keys(*tbl, p, {"backend", "path", "capacity", "ttl", "shards", "replicas"});
  if (auto b = c.choice(*tbl, p, "backend", backend_names, "storage backend", false))
    t.storage.backend = *b == "posix" ? storage_backend::posix : storage_backend::sim;
  auto path = c.string(*tbl, p, "path", t.storage.backend == storage_backend::posix,
                       "the posix backend stores blocks as files: add e.g. path = "
                       "\"/mnt/kv\"");
  if (path) {
    if (t.storage.backend == storage_backend::sim)
      c.error(tbl->get("path")->source(), "storage.path",
              "applies only to the posix backend",
              "remove it, or set backend = \"posix\"");
    else
      t.storage.path = *path;
  }
  if (auto cap = c.size(*tbl, p, "capacity", true, "add e.g. capacity = \"100PiB\"")) {
    if (*cap == 0)
      c.error(tbl->get("capacity")->source(), "storage.capacity", "must be larger than zero");
    else
      t.storage.capacity_bytes = *cap;
  }
  if (auto n = c.integer(*tbl, p, "shards", 1, max_store_shards, false))
    t.storage.shards = static_cast<std::uint32_t>(*n);
  if (auto n = c.integer(*tbl, p, "replicas", 1, max_store_replicas, false)) {
    if (static_cast<std::uint64_t>(*n) > t.storage.real_shards())
      c.error(tbl->get("replicas")->source(), "storage.replicas",
              "a block's copies are on different shards: " + std::to_string(*n)
                + " replicas need at least as many shards, and storage.shards is "
                + (t.storage.shards == 0 ? "not set (one shard)"
                                         : std::to_string(t.storage.shards)),
              "set shards = " + std::to_string(*n) + " or more, or fewer replicas");
    else
      t.storage.replicas = static_cast<std::uint32_t>(*n);
  }
  auto* ttl = c.table(*tbl, p, "ttl", false);
  if (ttl == nullptr) {
    if (tbl->get("ttl") == nullptr) {
      t.storage.ttl["agent"] = std::chrono::hours{72};
      t.storage.ttl["chatbot"] = std::chrono::hours{168};
    }
    return;
  }
  for (auto&& [k, v] : *ttl) {
    auto kp = join_path("storage.ttl", k.str());
    if (!valid_name(k.str())) {
      c.error(k.source(), kp, "a traffic class name may only contain letters, digits, '-', '_' "
                              "and '.'");
      continue;
    }
    if (auto d = c.duration_node(v, kp))
      t.storage.ttl[std::string(k.str())] = *d;
  }
}

// Reads `instances`: an integer n (fixed size) or a table {min, initial, max}.
std::optional<instance_bounds> read_instances(checker& c, const toml::table& pool,
                                              const std::string& path) {
  auto* n = pool.get("instances");
  auto p = join_path(path, "instances");
  if (n == nullptr) {
    c.missing(pool, path, "instances", "add e.g. instances = { min = 1, initial = 2, max = 4 }");
    return std::nullopt;
  }
  if (n->is_integer()) {
    auto v = c.integer_node(*n, p, 1, max_instances);
    if (!v)
      return std::nullopt;
    auto u = static_cast<std::uint32_t>(*v);
    return instance_bounds{u, u, u};
  }
  auto* tbl = n->as_table();
  if (tbl == nullptr) {
    c.wrong_type(*n, p, "an integer or a table",
                 "write instances = { min = 1, initial = 2, max = 4 } or instances = 2");
    return std::nullopt;
  }
  c.check_keys(*tbl, p, {"min", "initial", "max"});
  auto min = c.integer(*tbl, p, "min", 0, max_instances, true, "add min = 0 or more");
  auto max = c.integer(*tbl, p, "max", 1, max_instances, true, "add max = 1 or more");
  auto initial = c.integer(*tbl, p, "initial", 0, max_instances, false);
  if (!min || !max || (tbl->get("initial") != nullptr && !initial))
    return std::nullopt;
  instance_bounds b;
  b.min = static_cast<std::uint32_t>(*min);
  b.max = static_cast<std::uint32_t>(*max);
  b.initial = initial ? static_cast<std::uint32_t>(*initial) : b.min;
  if (b.min > b.max) {
    c.error(tbl->get("min")->source(), join_path(p, "min"),
            fmt::format("min ({}) is above max ({})", b.min, b.max),
            "instance counts need min <= initial <= max");
    return std::nullopt;
  }
  if (b.initial < b.min || b.initial > b.max) {
    c.error(tbl->get("initial")->source(), join_path(p, "initial"),
            fmt::format("initial ({}) is outside [min, max] = [{}, {}]", b.initial, b.min, b.max),
            "instance counts need min <= initial <= max");
    return std::nullopt;
  }
  return b;
}

std::vector<std::uint64_t> default_buckets() {
  return {16 * 1024, 64 * 1024, 256 * 1024};
}

void read_buckets(checker& c, const toml::node& n, const std::string& path, pool_spec& pool) {
  auto* arr = n.as_array();
  if (arr == nullptr) {
    c.wrong_type(n, path, "an array of token counts",
                 "write e.g. buckets = [16384, 65536, 262144]");
    return;
  }
  std::vector<std::uint64_t> bounds;
  bool ok = true;
  for (std::size_t i = 0; i < arr->size(); ++i) {
    const auto& el = *arr->get(i);
    auto ep = fmt::format("{}[{}]", path, i);
    auto v = c.integer_node(el, ep, 1, std::numeric_limits<std::int64_t>::max());
    if (!v) {
      ok = false;
      continue;
    }
    auto u = static_cast<std::uint64_t>(*v);
    if (!bounds.empty() && u <= bounds.back()) {
      c.error(el.source(), ep,
              fmt::format("bucket bounds must increase strictly, but {} follows {}", u,
                          bounds.back()),
              "list upper bounds in tokens from smallest to largest, e.g. [16384, 65536, 262144]");
      ok = false;
    }
    bounds.push_back(u);
  }
  if (ok)
    pool.buckets = std::move(bounds);
}

struct pool_positions {
  const toml::node* name = nullptr;
  const toml::node* role = nullptr;
  const toml::node* instances = nullptr;
  const toml::table* table = nullptr;
};

/// Reads the required `name` of array entry `path` into `out`: a valid name not used by an
/// earlier entry (`names` maps each name to the line of its first definition). Reports and
/// returns false otherwise. `kind` ("pool", "node") and `example` shape the messages.
bool unique_name(checker& c, const toml::table& tbl, const std::string& path,
                 std::string_view kind, std::string_view example,
                 std::map<std::string, std::uint32_t>& names, std::string& out) {
  auto name = c.string(tbl, path, "name", true, fmt::format("add e.g. name = \"{}\"", example));
  if (!name)
    return false;
  out = *name;
  const auto* node = tbl.get("name");
  if (!valid_name(*name)) {
    c.error(node->source(), join_path(path, "name"),
            fmt::format("'{}' is not a valid {} name", *name, kind),
            "use letters, digits, '-', '_' and '.'");
    return false;
  }
  if (auto it = names.find(*name); it != names.end()) {
    c.error(node->source(), join_path(path, "name"),
            fmt::format("duplicate {} name '{}'", kind, *name),
            fmt::format("first defined on line {}; {} names must be unique", it->second, kind));
    return false;
  }
  names.emplace(*name, node->source().begin.line);
  return true;
}

void read_pools(checker& c, const toml::table& root, topology& t,
                std::vector<pool_positions>& positions) {
  auto* n = root.get("pool");
  if (n == nullptr) {
    c.missing(root, "", "pool",
              "add at least one [[pool]] with name, role, instances and gpus_per_instance");
    return;
  }
  auto* arr = n->as_array();
  if (arr != nullptr && arr->empty()) {
    c.error(n->source(), "pool", "must list at least one pool",
            "add [[pool]] sections with name, role, instances and gpus_per_instance");
    return;
  }
  if (arr == nullptr || !arr->is_array_of_tables()) {
    c.wrong_type(*n, "pool", "an array of tables",
                 "write [[pool]] (double brackets) before each pool");
    return;
  }
  std::map<std::string, std::uint32_t> names; // name → line of its first definition
  for (std::size_t i = 0; i < arr->size(); ++i) {
    const auto& tbl = *arr->get(i)->as_table();
    auto path = fmt::format("pool[{}]", i);
    c.check_keys(tbl, path,
                 {"name", "role", "instances", "gpus_per_instance", "ep_size", "buckets", "grace",
                  "chunk_tokens", "max_batch", "ranks_per_process"});
    pool_spec pool;
    bool ok = true;
    ok = unique_name(c, tbl, path, "pool", "prefill", names, pool.name) && ok;
    auto role = c.choice(tbl, path, "role", role_names, "pool role", true,
                         "add role = \"prefill\", \"decode\" or \"vision\"");
    if (role)
      pool.role = *role == "prefill" ? pool_role::prefill
                  : *role == "decode" ? pool_role::decode
                                      : pool_role::vision;
    else
      ok = false;
    auto instances = read_instances(c, tbl, path);
    auto gpus = c.integer(tbl, path, "gpus_per_instance", 1, max_gpus_per_instance, true,
                          "add e.g. gpus_per_instance = 8");
    auto ep = c.integer(tbl, path, "ep_size", 1, max_gpus_per_instance, false);
    if (!instances || !gpus || (tbl.get("ep_size") != nullptr && !ep))
      ok = false;
    if (instances)
      pool.instances = *instances;
    if (gpus) {
      pool.gpus_per_instance = static_cast<std::uint32_t>(*gpus);
      pool.ep_size = ep ? static_cast<std::uint32_t>(*ep) : pool.gpus_per_instance;
    }
    if (gpus && ep) {
      auto g = pool.gpus_per_instance;
      auto e = pool.ep_size;
      if (g % e != 0 && e % g != 0) {
        c.error(tbl.get("ep_size")->source(), join_path(path, "ep_size"),
                fmt::format("ep_size {} neither divides nor is a multiple of gpus_per_instance {}",
                            e, g),
                "an instance holds gpus_per_instance / ep_size EP groups, or one EP group spans "
                "ep_size / gpus_per_instance instances");
        ok = false;
      } else if (e > g && instances) {
        auto span = e / g;
        for (auto [key, value] : {std::pair{"min", pool.instances.min},
                                  std::pair{"initial", pool.instances.initial},
                                  std::pair{"max", pool.instances.max}}) {
          if (value % span == 0)
            continue;
          c.error(tbl.get("instances")->source(), join_path(path, "instances"),
                  fmt::format("{} = {} is not a multiple of {}, the number of instances one EP "
                              "group spans (ep_size {} / gpus_per_instance {})",
                              key, value, span, e, g),
                  "EP groups are added and removed whole");
          ok = false;
          break;
        }
      }
    }
    // Role-specific keys.
    if (const auto* b = tbl.get("buckets")) {
      if (role && pool.role != pool_role::prefill) {
        c.error(b->source(), join_path(path, "buckets"),
                fmt::format("applies only to prefill pools, not to {} pools", *role),
                "remove it, or set role = \"prefill\"");
        ok = false;
      } else {
        read_buckets(c, *b, join_path(path, "buckets"), pool);
      }
    } else if (pool.role == pool_role::prefill) {
      pool.buckets = default_buckets();
    }
    if (const auto* g = tbl.get("grace")) {
      if (role && pool.role != pool_role::decode) {
        c.error(g->source(), join_path(path, "grace"),
                fmt::format("applies only to decode pools, not to {} pools", *role),
                "remove it, or set role = \"decode\"");
        ok = false;
      } else if (auto d = c.duration_node(*g, join_path(path, "grace"))) {
        pool.grace = *d;
      }
    } else if (pool.role == pool_role::decode) {
      pool.grace = std::chrono::seconds{60};
    }
    // A role's step budget (real world), where it applies.
    for (auto [key, applies, role_name] :
         {std::tuple{"chunk_tokens", pool_role::prefill, "prefill"},
          std::tuple{"max_batch", pool_role::decode, "decode"}}) {
      const auto* n = tbl.get(key);
      if (n == nullptr)
        continue;
      if (role && pool.role != applies) {
        c.error(n->source(), join_path(path, key),
                fmt::format("applies only to {} pools, not to {} pools", role_name, *role),
                fmt::format("remove it, or set role = \"{}\"", role_name));
        ok = false;
        continue;
      }
      auto v = c.integer(tbl, path, key, 1,
                         applies == pool_role::prefill ? std::int64_t{1} << 24 : 4096, false);
      if (!v) {
        ok = false;
      } else if (applies == pool_role::prefill) {
        pool.chunk_tokens = static_cast<std::uint64_t>(*v);
      } else {
        pool.max_batch = static_cast<std::uint32_t>(*v);
      }
    }
    // The real world's split of an instance's ranks over processes (0: all in one).
    if (const auto* n = tbl.get("ranks_per_process")) {
      auto v = c.integer(tbl, path, "ranks_per_process", 1, std::int64_t{1} << 16, false);
      if (!v) {
        ok = false;
      } else if (pool.gpus_per_instance > 0 && *v > pool.gpus_per_instance) {
        c.error(n->source(), join_path(path, "ranks_per_process"),
                fmt::format("is {}, but an instance has {} rank(s) (gpus_per_instance)", *v,
                            pool.gpus_per_instance),
                "make it at most gpus_per_instance");
        ok = false;
      } else {
        pool.ranks_per_process = static_cast<std::uint32_t>(*v);
      }
    }
    positions.push_back({tbl.get("name"), tbl.get("role"), tbl.get("instances"), &tbl});
    if (ok)
      t.pools.push_back(std::move(pool));
    else
      positions.pop_back();
  }
}

void read_autoscaler(checker& c, const toml::table& root, topology& t, bool pools_complete) {
  auto& a = t.autoscaler;
  a.interval = std::chrono::seconds{30};
  a.max_step_up = 2;
  a.max_step_down = 1;
  a.over_provision = 0.1;
  a.ready_inventory = 0;
  a.scale_down_occupancy_limit = 0.8;
  a.enabled = false;
  a.inventory_join = std::chrono::seconds{10};
  a.inventory_refill = std::chrono::minutes{5};
  a.scale_down_after = std::chrono::seconds{60};
  std::uint64_t min_gpus = 0;
  std::uint64_t initial_gpus = 0;
  std::uint64_t max_gpus = 0;
  for (const auto& p : t.pools) {
    min_gpus += p.gpus(p.instances.min);
    initial_gpus += p.gpus(p.instances.initial);
    max_gpus += p.gpus(p.instances.max);
  }
  a.quota = max_gpus;
  auto* tbl = c.table(root, "", "autoscaler", false);
  if (tbl == nullptr)
    return;
  const std::string p = "autoscaler";
  c.check_keys(*tbl, p,
               {"interval", "max_step_up", "max_step_down", "over_provision", "ready_inventory",
                "quota", "scale_down_occupancy_limit", "enabled", "inventory_join",
                "inventory_refill", "scale_down_after"});
  if (auto b = c.boolean(*tbl, p, "enabled"))
    a.enabled = *b;
  if (auto d = c.duration(*tbl, p, "interval"))
    a.interval = *d;
  if (auto d = c.duration(*tbl, p, "inventory_join"))
    a.inventory_join = *d;
  if (auto d = c.duration(*tbl, p, "inventory_refill"))
    a.inventory_refill = *d;
  if (auto d = c.duration(*tbl, p, "scale_down_after", true))
    a.scale_down_after = *d;
  if (auto v = c.integer(*tbl, p, "max_step_up", 1, max_instances, false))
    a.max_step_up = static_cast<std::uint32_t>(*v);
  if (auto v = c.integer(*tbl, p, "max_step_down", 1, max_instances, false))
    a.max_step_down = static_cast<std::uint32_t>(*v);
  if (auto v = c.number(*tbl, p, "over_provision", 0, 1, false,
                        "a fraction: 0.1 keeps 10% more instances online than needed"))
    a.over_provision = *v;
  if (auto v = c.integer(*tbl, p, "ready_inventory", 0, max_instances, false))
    a.ready_inventory = static_cast<std::uint32_t>(*v);
  if (auto v = c.number(*tbl, p, "scale_down_occupancy_limit", 0, 1, true,
                        "a fraction of the quota: 0.8 means no scale-down above 80% occupancy"))
    a.scale_down_occupancy_limit = *v;
  if (auto v = c.integer(*tbl, p, "quota", 1, std::numeric_limits<std::int64_t>::max(), false)) {
    a.quota = static_cast<std::uint64_t>(*v);
    // Only meaningful when every pool was read: otherwise the sums are too small.
    if (pools_complete) {
      const auto& where = tbl->get("quota")->source();
      if (a.quota < min_gpus)
        c.error(where, "autoscaler.quota",
                fmt::format("quota of {} GPUs is below the {} GPUs the pools need at their "
                            "minimum sizes",
                            a.quota, min_gpus),
                fmt::format("raise quota to at least {} or lower the pools' min instances",
                            min_gpus));
      else if (a.quota < initial_gpus)
        c.error(where, "autoscaler.quota",
                fmt::format("quota of {} GPUs is below the {} GPUs the pools need at their "
                            "initial sizes",
                            a.quota, initial_gpus),
                fmt::format("raise quota to at least {} or lower the pools' initial instances",
                            initial_gpus));
    }
  }
}

// Reads the [[node]] sections; returns true when every one of them is valid.
bool read_nodes(checker& c, const toml::table& root, topology& t) {
  auto* n = root.get("node");
  if (n == nullptr)
    return true;
  auto* arr = n->as_array();
  if (arr != nullptr && arr->empty())
    return true; // node = []: no nodes, as if the key were absent
  if (arr == nullptr || !arr->is_array_of_tables()) {
    c.wrong_type(*n, "node", "an array of tables",
                 "write [[node]] (double brackets) before each node");
    return false;
  }
  std::map<std::string, std::uint32_t> names;
  std::map<std::string, std::uint32_t> endpoints;
  for (std::size_t i = 0; i < arr->size(); ++i) {
    const auto& tbl = *arr->get(i)->as_table();
    auto path = fmt::format("node[{}]", i);
    c.check_keys(tbl, path, {"name", "host", "port", "gpus", "roles"});
    node_spec node;
    bool ok = true;
    ok = unique_name(c, tbl, path, "node", "node-0", names, node.name) && ok;
    auto host = c.string(tbl, path, "host", true, "add e.g. host = \"10.0.0.1\"");
    auto port = c.integer(tbl, path, "port", 1, 65535, true, "add e.g. port = 4242");
    auto gpus = c.integer(tbl, path, "gpus", 1, max_gpus_per_instance, true,
                          "add e.g. gpus = 8");
    if (!host || !port || !gpus)
      ok = false;
    if (host)
      node.host = *host;
    if (port)
      node.port = static_cast<std::uint16_t>(*port);
    if (gpus)
      node.gpus = static_cast<std::uint32_t>(*gpus);
    if (host && port) {
      auto endpoint = fmt::format("{}:{}", *host, *port);
      if (auto it = endpoints.find(endpoint); it != endpoints.end()) {
        c.error(tbl.get("port")->source(), join_path(path, "port"),
                fmt::format("{} is already used by the node on line {}", endpoint, it->second),
                "give each node its own host:port");
        ok = false;
      } else {
        endpoints.emplace(endpoint, tbl.get("port")->source().begin.line);
      }
    }
    auto* roles = tbl.get("roles");
    auto rp = join_path(path, "roles");
    if (roles == nullptr) {
      c.missing(tbl, path, "roles", "add e.g. roles = [\"prefill\", \"decode\"]");
      ok = false;
    } else if (auto* ra = roles->as_array(); ra == nullptr) {
      c.wrong_type(*roles, rp, "an array of roles", "write e.g. roles = [\"decode\"]");
      ok = false;
    } else if (ra->empty()) {
      c.error(roles->source(), rp, "must list at least one role",
              "write e.g. roles = [\"decode\"]");
      ok = false;
    } else {
      for (std::size_t j = 0; j < ra->size(); ++j) {
        auto ep = fmt::format("{}[{}]", rp, j);
        auto r = c.choice_node(*ra->get(j), ep, role_names, "pool role");
        if (!r) {
          ok = false;
          continue;
        }
        auto role = *r == "prefill" ? pool_role::prefill
                    : *r == "decode" ? pool_role::decode
                                     : pool_role::vision;
        if (std::find(node.roles.begin(), node.roles.end(), role) != node.roles.end()) {
          c.error(ra->get(j)->source(), ep, fmt::format("role '{}' is listed twice", *r));
          ok = false;
          continue;
        }
        node.roles.push_back(role);
      }
    }
    if (ok)
      t.nodes.push_back(std::move(node));
  }
  return t.nodes.size() == arr->size();
}

// With nodes given, each pool role must be served by nodes with enough GPUs for its pools'
// initial sizes.
void check_node_capacity(checker& c, const topology& t,
                         const std::vector<pool_positions>& positions) {
  if (t.nodes.empty())
    return;
  for (auto role : {pool_role::prefill, pool_role::decode, pool_role::vision}) {
    std::uint64_t needed = 0;
    const pool_positions* first = nullptr;
    for (std::size_t i = 0; i < t.pools.size(); ++i) {
      if (t.pools[i].role != role)
        continue;
      needed += t.pools[i].gpus(t.pools[i].instances.initial);
      if (first == nullptr)
        first = &positions[i];
    }
    if (first == nullptr)
      continue;
    std::uint64_t offered = 0;
    for (const auto& n : t.nodes)
      if (std::find(n.roles.begin(), n.roles.end(), role) != n.roles.end())
        offered += n.gpus;
    if (offered >= needed)
      continue;
    auto idx = static_cast<std::size_t>(first - positions.data());
    auto path = fmt::format("pool[{}]", idx);
    if (offered == 0)
      c.error(first->role->source(), join_path(path, "role"),
              fmt::format("no [[node]] serves role '{}'", to_string(role)),
              fmt::format("add \"{}\" to the roles of a node", to_string(role)));
    else
      c.error(first->instances->source(), join_path(path, "instances"),
              fmt::format("the nodes serving {} have {} GPUs, fewer than the {} its pools need "
                          "at initial size",
                          to_string(role), offered, needed),
              "add nodes or lower the initial instances");
  }
}

} // namespace

load_result parse_topology(std::string_view text, std::string_view file_name) {
  load_result result;
  checker c{std::string(file_name)};
  toml::table root;
  try {
    root = toml::parse(text, file_name);
  } catch (const toml::parse_error& e) {
    c.error(e.source(), "", fmt::format("TOML syntax error: {}", e.description()));
    result.errors = c.take_errors();
    return result;
  }
  topology t;
  t.source = std::string(file_name);
  c.check_keys(root, "", {"cluster", "storage", "pool", "autoscaler", "node"});
  read_cluster(c, root, t);
  read_storage(c, root, t);
  std::vector<pool_positions> positions;
  read_pools(c, root, t, positions);
  auto* pools = root.get("pool");
  bool pools_complete = pools != nullptr && pools->is_array_of_tables()
                        && pools->as_array()->size() == t.pools.size();
  read_autoscaler(c, root, t, pools_complete);
  bool nodes_complete = read_nodes(c, root, t);
  if (pools_complete) {
    bool has_prefill = false;
    bool has_decode = false;
    for (const auto& p : t.pools) {
      has_prefill |= p.role == pool_role::prefill;
      has_decode |= p.role == pool_role::decode;
    }
    if (!has_prefill || !has_decode)
      c.error(pools->source(), "pool",
              fmt::format("a cluster needs at least one prefill pool and one decode pool; this "
                          "one has no {} pool",
                          has_prefill ? "decode" : "prefill"),
              fmt::format("add a [[pool]] with role = \"{}\"", has_prefill ? "decode" : "prefill"));
    std::uint64_t gpus = 0;
    std::uint64_t instances = 0;
    for (const auto& p : t.pools) {
      gpus += p.gpus(p.instances.max);
      instances += p.instances.max;
    }
    if (instances > max_cluster_instances)
      c.error(pools->source(), "pool",
              fmt::format("the pools hold {} instances at their max sizes; the limit is {}",
                          instances, max_cluster_instances),
              "lower the pools' instances.max (docs/topology.md, \"Limits\")");
    if (gpus > max_cluster_gpus)
      c.error(pools->source(), "pool",
              fmt::format("the pools hold {} GPUs at their max sizes; the limit is {}", gpus,
                          max_cluster_gpus),
              "lower instances.max or gpus_per_instance (docs/topology.md, \"Limits\")");
    if (nodes_complete)
      check_node_capacity(c, t, positions);
  }
  if (c.failed()) {
    result.errors = c.take_errors();
    return result;
  }
  result.value = std::move(t);
  return result;
}

const pool_spec* find_pool(const topology& topo, pool_role role) {
  for (const auto& p : topo.pools)
    if (p.role == role)
      return &p;
  return nullptr;
}

load_result load_topology(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    load_result result;
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
  return parse_topology(text.str(), file.string());
}

topology_summary summarize(const topology& t) {
  topology_summary s;
  for (const auto& p : t.pools) {
    pool_gpus g;
    g.name = p.name;
    g.role = p.role;
    g.ep_size = p.ep_size;
    g.min = p.gpus(p.instances.min);
    g.initial = p.gpus(p.instances.initial);
    g.max = p.gpus(p.instances.max);
    s.min_gpus += g.min;
    s.initial_gpus += g.initial;
    s.max_gpus += g.max;
    s.pools.push_back(std::move(g));
  }
  s.quota = t.autoscaler.quota;
  s.initial_occupancy =
    s.quota == 0 ? 0.0 : static_cast<double>(s.initial_gpus) / static_cast<double>(s.quota);
  return s;
}

std::string describe(const topology& t) {
  auto s = summarize(t);
  std::string out;
  auto line = [&out]<class... Args>(fmt::format_string<Args...> f, Args&&... args) {
    out += fmt::format(f, std::forward<Args>(args)...);
    while (!out.empty() && out.back() == ' ')
      out.pop_back();
    out += '\n';
  };
  line("cluster     {}", t.cluster.name);
  line("  model     {}", t.cluster.model);
  line("  hardware  {}", t.cluster.hardware);
  line("  device    {}", t.cluster.device.empty() ? "none (simulator only)" : t.cluster.device);
  line("");
  line("storage");
  line("  backend   {}", to_string(t.storage.backend));
  if (t.storage.backend == storage_backend::posix)
    line("  path      {}", t.storage.path);
  line("  capacity  {} ({} bytes)", runtime::format_bytes(t.storage.capacity_bytes),
       t.storage.capacity_bytes);
  if (t.storage.shards > 0)
    line("  shards    {}", t.storage.shards);
  if (t.storage.replicas > 0)
    line("  replicas  {}", t.storage.replicas);
  std::string ttl;
  for (const auto& [cls, d] : t.storage.ttl) {
    if (!ttl.empty())
      ttl += ", ";
    ttl += cls + " " + runtime::format_duration(d);
  }
  line("  ttl       {}", ttl.empty() ? "(none)" : ttl);
  line("");
  std::size_t w = 4;
  for (const auto& p : t.pools)
    w = std::max(w, p.name.size());
  line("pools");
  line("  {:<{}}  {:<7}  {:>16}  {:>9}  {:>4}  {:>17}  {}", "name", w, "role",
       "instances", "gpus/inst", "ep", "gpus", "routing");
  line("  {:<{}}  {:<7}  {:>16}  {:>9}  {:>4}  {:>17}", "", w, "", "min/initial/max", "", "",
       "min/initial/max");
  for (std::size_t i = 0; i < t.pools.size(); ++i) {
    const auto& p = t.pools[i];
    const auto& g = s.pools[i];
    std::string routing;
    if (p.role == pool_role::prefill) {
      routing = "buckets";
      std::uint64_t lo = 0;
      for (auto b : p.buckets) {
        routing += fmt::format(" [{},{})", format_tokens(lo), format_tokens(b));
        lo = b;
      }
      routing += fmt::format(" [{},inf)", format_tokens(lo));
      if (p.chunk_tokens > 0)
        routing += fmt::format(", chunk {}", p.chunk_tokens);
    } else if (p.role == pool_role::decode) {
      routing = "grace " + runtime::format_duration(p.grace);
      if (p.max_batch > 0)
        routing += fmt::format(", max batch {}", p.max_batch);
    }
    if (p.ranks_per_process > 0 && p.ranks_per_process < p.gpus_per_instance)
      routing += fmt::format(", {} rank(s) per process", p.ranks_per_process);
    line("  {:<{}}  {:<7}  {:>16}  {:>9}  {:>4}  {:>17}  {}", p.name, w, to_string(p.role),
         fmt::format("{}/{}/{}", p.instances.min, p.instances.initial, p.instances.max),
         p.gpus_per_instance, p.ep_size, fmt::format("{}/{}/{}", g.min, g.initial, g.max),
         routing);
  }
  line("  {:<{}}  {:<7}  {:>16}  {:>9}  {:>4}  {:>17}", "total", w, "", "", "", "",
       fmt::format("{}/{}/{}", s.min_gpus, s.initial_gpus, s.max_gpus));
  line("");
  const auto& a = t.autoscaler;
  line("autoscaler");
  line("  enabled                     {}", a.enabled ? "yes" : "no (the simulation keeps initial sizes)");
  line("  interval                    {}", runtime::format_duration(a.interval));
  line("  max step up / down          {} / {} instances per pool", a.max_step_up,
       a.max_step_down);
  line("  over-provision              {:g}%", a.over_provision * 100);
  line("  ready inventory             {} instances (join in {}, refilled in {})",
       a.ready_inventory, runtime::format_duration(a.inventory_join),
       runtime::format_duration(a.inventory_refill));
  line("  quota                       {} GPUs", a.quota);
  line("  occupancy at initial size   {} / {} GPUs = {:.1f}%", s.initial_gpus, s.quota,
       s.initial_occupancy * 100);
  line("  scale-down occupancy limit  {:g}%", a.scale_down_occupancy_limit * 100);
  line("  scale-down delay            {} of wanting fewer instances",
       runtime::format_duration(a.scale_down_after));
  line("");
  if (t.nodes.empty()) {
    line("nodes       none (the simulated world places the pools)");
  } else {
    std::size_t nw = 4;
    std::size_t hw = 4;
    for (const auto& n : t.nodes) {
      nw = std::max(nw, n.name.size());
      hw = std::max(hw, n.host.size() + 6);
    }
    std::uint64_t total = 0;
    line("nodes");
    line("  {:<{}}  {:<{}}  {:>5}  {}", "name", nw, "address", hw, "gpus", "roles");
    for (const auto& n : t.nodes) {
      std::string roles;
      for (auto r : n.roles) {
        if (!roles.empty())
          roles += ",";
        roles += to_string(r);
      }
      line("  {:<{}}  {:<{}}  {:>5}  {}", n.name, nw, fmt::format("{}:{}", n.host, n.port), hw,
           n.gpus, roles);
      total += n.gpus;
    }
    line("  {:<{}}  {:<{}}  {:>5}", "total", nw, "", hw, total);
  }
  return out;
}

} // namespace troupe::cluster

#include "cluster/real_graph.hpp"

#include "runtime/log.hpp"

#include "actors/instance.hpp"
#include "cluster/autoscaling.hpp"
#include "cluster/sim/expert_placement.hpp"
#include "runtime/supervisor.hpp"

#include <caf/actor_system.hpp>
#include <caf/local_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <map>

namespace troupe::cluster {

namespace {

using namespace std::chrono_literals;

} // namespace

void index_stored_blocks(caf::actor_system& sys, const runtime::store_port& store,
                         const actors::kv_check_actor& kv, std::chrono::seconds wait) {
  caf::scoped_actor self{sys};
  std::vector<runtime::store_entry> entries;
  self->request(store, wait, runtime::store_list{})
    .receive([&](std::vector<runtime::store_entry>& e) { entries = std::move(e); },
             [](const caf::error&) {});
  constexpr std::size_t batch = 4096;
  for (std::size_t i = 0; i < entries.size(); i += batch) {
    actors::kv_insert ins;
    for (std::size_t k = i; k < std::min(entries.size(), i + batch); ++k)
      ins.blocks.push_back(actors::block_key{entries[k].key.hi, entries[k].key.lo});
    self->request(kv, wait, std::move(ins))
      .receive([](const actors::kv_insert_result&) {}, [](const caf::error&) {});
  }
}

std::string check_real_topology(const topology& topo) {
  const auto* prefill = find_pool(topo, pool_role::prefill);
  const auto* decode = find_pool(topo, pool_role::decode);
  if (prefill == nullptr || decode == nullptr)
    return topo.source + ": the real world needs a prefill and a decode pool";
  for (const auto* pool : {prefill, decode}) {
    const auto n = std::to_string(pool->gpus_per_instance);
    if (pool->gpus_per_instance != 1 && topo.cluster.device != "cpu")
      return topo.source + ": pool '" + pool->name + "' has gpus_per_instance = " + n
             + "; the " + (topo.cluster.device == "cuda" ? "CUDA" : topo.cluster.device)
             + " backend runs one GPU per instance so far (expert parallelism over NCCL is not "
               "in the device port yet: docs/cuda.md); set it to 1";
    if (pool->ep_size != pool->gpus_per_instance)
      return topo.source + ": pool '" + pool->name + "' has ep_size = "
             + std::to_string(pool->ep_size) + " and gpus_per_instance = " + n
             + "; the CPU backend runs an instance's ranks as one EP group (make them equal)";
  }
  return {};
}

namespace {

actors::kv_index_params kv_params(const topology& topo, const real_graph_params& params) {
  actors::kv_index_params kv;
  kv.capacity_bytes = topo.storage.capacity_bytes;
  kv.block_bytes = params.block_bytes;
  if (auto i = topo.storage.ttl.find("chatbot"); i != topo.storage.ttl.end())
    kv.ttl.chatbot = i->second;
  if (auto i = topo.storage.ttl.find("agent"); i != topo.storage.ttl.end())
    kv.ttl.agent = i->second;
  return kv;
}

} // namespace

control_graph spawn_control_graph(caf::actor_system& sys, const topology& topo,
                                  const real_graph_params& params, std::chrono::seconds wait) {
  const auto& prefill_pool = *find_pool(topo, pool_role::prefill);
  control_graph g;
  // The KV CHECK role and the balancers.
  auto kv = kv_params(topo, params);
  kv.history = params.history;
  g.kv = actors::spawn_sharded_kv_store(sys, kv, 1);
  if (params.store)
    index_stored_blocks(sys, params.store, g.kv, wait);
  actors::prefill_lb_params plb;
  plb.balancer.bucket_bounds = prefill_pool.buckets;
  g.prefill_lb = actors::spawn_prefill_lb(sys, plb);
  actors::decode_balancer_params dlb;
  dlb.max_requests = params.max_batch;
  if (params.decode_kv_tokens > 0)
    dlb.max_kv_tokens = params.decode_kv_tokens;
  g.decode_lb = actors::spawn_decode_lb(sys, dlb, params.history);

  // The front door.
  actors::generation_service_params gp;
  gp.services = actors::request_services{g.kv, g.prefill_lb, g.decode_lb,
                                         params.block_bytes / 128, params.outcomes, {}};
  // Every token leaves for the client as soon as it is generated (the simulator batches its
  // notices by 16 to stay cheap).
  gp.services.progress_every = 1;
  gp.services.chain_root = params.chain_root;
  gp.services.history = params.history;
  gp.services.stream_kv = params.stream_kv;
  gp.max_context = params.max_context;
  g.service = actors::spawn_generation_service(sys, gp);
  return g;
}

namespace {

// The autoscaler's decisions as gauges and counters of `reg`: each pool's instances by state,
// demand and target, and the instances it ordered and removed. Empty when a family cannot be
// registered (a clash with another family of that name).
std::function<void(const actors::scale_inputs&, const actors::scale_decision&)>
decision_metrics(runtime::registry& reg) {
  auto instances = reg.add_gauge("troupe_autoscaler_instances",
                                 "A pool's instances at the autoscaler's last decision, by state.",
                                 {"pool", "state"});
  auto demand = reg.add_gauge(
    "troupe_autoscaler_demand",
    "A pool's demand at the last decision: prefill cache-missed tokens per second, decode "
    "requests in compute or waiting for room.",
    {"pool"});
  auto target = reg.add_gauge("troupe_autoscaler_target",
                              "Instances the autoscaler's last decision aims a pool at.", {"pool"});
  auto scaled = reg.add_counter("troupe_autoscaler_scaled_total",
                                "Instances the autoscaler ordered (up) or removed (down).",
                                {"pool", "direction"});
  if (!instances || !demand || !target || !scaled)
    return {};
  return [instances = *instances, demand = *demand, target = *target,
          scaled = *scaled](const actors::scale_inputs& in, const actors::scale_decision& d) {
    for (std::size_t k = 0; k < in.pools.size() && k < d.pools.size(); ++k) {
      const auto& p = in.pools[k];
      for (auto [state, n] : {std::pair{"online", p.online}, {"starting", p.starting},
                              {"draining", p.draining}, {"down", p.down}})
        if (auto g = instances->with({p.pool, state}))
          (*g)->set(n);
      if (auto g = demand->with({p.pool}))
        (*g)->set(p.demand);
      if (auto g = target->with({p.pool}))
        (*g)->set(d.pools[k].target);
      for (auto [direction, n] : {std::pair{"up", d.pools[k].up}, {"down", d.pools[k].down}})
        if (auto c = scaled->with({p.pool, direction}))
          (*c)->inc(n);
    }
  };
}

// Makes the child spec of instance `id` of pool `role` (pool_supervisor_config's children, and
// those the autoscaler orders).
std::function<runtime::child_spec(actors::instance_id)>
instance_maker(const topology& topo, pool_role role, const real_graph_params& params,
               const actors::kv_check_actor& kv, const caf::actor& lb, const caf::actor& kept_to) {
  const auto& pool = *find_pool(topo, role);
  auto ports = actors::instance_ports{};
  // One device runs an incarnation's ranks (as threads of its EP group): the leader's call
  // makes it, the other ranks', which start right after (the supervisor starts the ranks in
  // order), watch the same device, so it going down takes each of them down. (Weak: a
  // device lives as long as its instance's ranks hold it.)
  auto leaders = std::make_shared<std::map<actors::instance_id, caf::actor_addr>>();
  ports.device = [make = params.device, role, leaders](caf::local_actor* self,
                                                       actors::instance_id id, std::uint32_t rank,
                                                       std::uint32_t size) {
    if (rank > 0)
      return caf::actor_cast<runtime::device_port>((*leaders)[id]);
    auto device = make(self->system(), role, id, size);
    (*leaders)[id] = caf::actor_cast<caf::actor_addr>(device);
    return device;
  };
  if (!params.healthy_gpus.empty() || params.losses) {
    auto healthy = params.healthy_gpus;
    if (healthy.empty())
      for (std::uint32_t g = 0; g < pool.gpus_per_instance; ++g)
        healthy.push_back(g);
    ports.gpus = [healthy, n = pool.gpus_per_instance, experts = params.experts, role,
                  losses = params.losses, name = pool.name](actors::instance_id id) {
      auto gpus = healthy;
      const auto lost = losses ? losses->lost(role, id) : 0;
      gpus.resize(gpus.size() - std::min<std::size_t>(lost, gpus.size()));
      gpus.resize(std::min<std::size_t>(
        gpus.size(), sim::resized_ep(n, static_cast<std::uint32_t>(gpus.size()), experts)));
      if (lost > 0) {
        runtime::log::get("instance")->warn(
          "{}/{}: {} rank(s) lost with their processes; it forms on {} rank(s) (EP {} -> {})",
          name, id, lost, gpus.size(), n, gpus.size());
        losses->formed(role, id, static_cast<std::uint32_t>(gpus.size()));
      }
      return gpus;
    };
  }
  // Inside one process the KV moves between instances by handle: no link port.
  ports.link = [](caf::local_actor*, actors::instance_id) { return runtime::link_port{}; };
  // Prefill persists the prompt's blocks, decode those its output fills.
  actors::block_writer_params writer;
  if (params.store) {
    writer.kv = kv;
    writer.store = params.store;
    writer.ttl = kv_params(topo, params).ttl;
  }
  if (role == pool_role::prefill) {
    actors::prefill_engine_params pe;
    pe.step_tokens = params.prefill_chunk;
    pe.draft_context = params.spec.spec != actors::speculation::off;
    pe.writer = writer;
    return [name = pool.name, pe, ports, lb = caf::actor_cast<actors::prefill_lb_actor>(lb),
            keep = params.keep_windows, ranks = pool.gpus_per_instance](actors::instance_id i) {
      return actors::prefill_instance(name, i, ranks, pe, ports, lb, keep);
    };
  }
  actors::decode_engine_params de;
  de.max_batch = params.max_batch;
  de.spec = params.spec.spec;
  de.fixed_drafts = params.spec.fixed_drafts;
  de.overlap = params.overlap;
  de.step_cost = params.step_cost;
  return [name = pool.name, de, ports, lb = caf::actor_cast<actors::decode_lb_actor>(lb), writer,
          kept = params.keep_windows ? kept_to : caf::actor{},
          ranks = pool.gpus_per_instance](actors::instance_id i) {
    return actors::decode_instance(name, i, ranks, de, ports, lb, writer, kept);
  };
}

} // namespace

runtime::supervisor_config pool_supervisor_config(const topology& topo, pool_role role,
                                                  const real_graph_params& params,
                                                  const actors::kv_check_actor& kv,
                                                  const caf::actor& lb,
                                                  const std::vector<std::uint32_t>& instances,
                                                  const caf::actor& kept_to) {
  runtime::supervisor_flags flags{runtime::strategy::one_for_one, 10, 1min, 1s, 2.0, 30s};
  runtime::supervisor_config cfg{find_pool(topo, role)->name, flags, {}};
  const auto make = instance_maker(topo, role, params, kv, lb, kept_to);
  for (auto i : instances)
    cfg.children.push_back(make(i));
  return cfg;
}

actors::autoscaler_params real_autoscaler_params(
  const topology& topo, const real_graph_params& params, const actors::prefill_lb_actor& prefill_lb,
  const actors::decode_lb_actor& decode_lb,
  std::function<runtime::child_spec(actors::instance_id)> make_prefill,
  std::function<runtime::child_spec(actors::instance_id)> make_decode) {
  actors::autoscaler_params ap;
  ap.interval = topo.autoscaler.interval;
  ap.limits = scale_limits_of(topo.autoscaler);
  // No machines to acquire: an instance ordered starts at once and serves once its device has
  // loaded the model; an inventory slot refills at once.
  ap.join = runtime::duration{0};
  ap.refill = runtime::duration{0};
  ap.prefill_lb = prefill_lb;
  ap.decode_lb = decode_lb;
  // A prefill instance's capacity is measured (tokens per second of device time, once the
  // engines have run a second); until then a prefill pool is never short.
  ap.prefill = autoscaled_pool_of(*find_pool(topo, pool_role::prefill), 1e18,
                                  std::move(make_prefill));
  ap.decode = autoscaled_pool_of(*find_pool(topo, pool_role::decode),
                                 static_cast<double>(params.max_batch), std::move(make_decode));
  // No log: decisions are logged on stderr, and a record of each would grow for as long as the
  // server runs; with a registry, the last one's figures are metrics.
  if (params.metrics != nullptr)
    ap.on_decision = decision_metrics(*params.metrics);
  return ap;
}

void rank_losses::lose(pool_role role, std::uint32_t instance, std::uint32_t ranks) {
  std::lock_guard lock(mutex_);
  lost_[{role, instance}] += ranks;
}

std::uint32_t rank_losses::lost(pool_role role, std::uint32_t instance) const {
  std::lock_guard lock(mutex_);
  auto it = lost_.find({role, instance});
  return it == lost_.end() ? 0 : it->second;
}

void rank_losses::on_formed(formed_fn f) {
  std::lock_guard lock(mutex_);
  formed_ = std::move(f);
}

void rank_losses::formed(pool_role role, std::uint32_t instance, std::uint32_t ranks) const {
  formed_fn f;
  {
    std::lock_guard lock(mutex_);
    f = formed_;
  }
  if (f)
    f(role, instance, ranks);
}

real_graph spawn_real_graph(caf::actor_system& sys, const topology& topo,
                            const real_graph_params& params, std::chrono::seconds wait) {
  real_graph g;
  auto control = spawn_control_graph(sys, topo, params, wait);
  g.kv = control.kv;
  g.prefill_lb = control.prefill_lb;
  g.decode_lb = control.decode_lb;
  g.service = control.service;
  // Pools: a supervisor each, instances as its children, each with one rank on one device.
  auto all = [&](pool_role role) {
    std::vector<std::uint32_t> ids(find_pool(topo, role)->instances.initial);
    for (std::uint32_t i = 0; i < ids.size(); ++i)
      ids[i] = i;
    return ids;
  };
  auto prefill = pool_supervisor_config(topo, pool_role::prefill, params, g.kv,
                                        caf::actor_cast<caf::actor>(g.prefill_lb),
                                        all(pool_role::prefill));
  auto decode = pool_supervisor_config(topo, pool_role::decode, params, g.kv,
                                       caf::actor_cast<caf::actor>(g.decode_lb),
                                       all(pool_role::decode),
                                       caf::actor_cast<caf::actor>(g.prefill_lb));
  std::vector<runtime::child_spec> children{runtime::supervisor_child(std::move(prefill)),
                                            runtime::supervisor_child(std::move(decode))};
  if (topo.autoscaler.enabled) {
    // The simulator's autoscaler, on the same pools: a child of the root it acts on, so it
    // stops (first: it is the last child) and restarts with the graph.
    auto ap = real_autoscaler_params(
      topo, params, g.prefill_lb, g.decode_lb,
      instance_maker(topo, pool_role::prefill, params, g.kv,
                     caf::actor_cast<caf::actor>(g.prefill_lb), {}),
      instance_maker(topo, pool_role::decode, params, g.kv,
                     caf::actor_cast<caf::actor>(g.decode_lb),
                     caf::actor_cast<caf::actor>(g.prefill_lb)));
    children.push_back(runtime::child_spec{
      "autoscaler", [ap](caf::local_actor* self) {
        auto p = ap;
        p.root = caf::actor_cast<caf::actor>(self);
        return actors::spawn_autoscaler(self->system(), std::move(p));
      }});
  }
  g.cluster = runtime::spawn_supervisor(
    sys, {topo.cluster.name, {runtime::strategy::one_for_one, 10, 1min}, std::move(children)});
  return g;
}

} // namespace troupe::cluster

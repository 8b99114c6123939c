#include "cluster/sim/fault_injection.hpp"

#include "cluster/sim/expert_placement.hpp"
#include "runtime/errors.hpp"

#include <caf/all.hpp>

#include <algorithm>

namespace troupe::cluster::sim {

namespace {

using link_retry_atom = caf::atom_constant<caf::atom("linkretry")>;

// A transfer held while its link is cut is checked again when the cut should end (a later
// partition may have extended it).
caf::behavior faulty_link_fn(caf::event_based_actor* self, runtime::link_port inner,
                             double bandwidth, std::shared_ptr<const fleet_state> fleet,
                             std::string key) {
  struct held {
    runtime::link_transfer transfer;
    caf::typed_response_promise<runtime::link_delivery> promise;
  };
  auto pending = std::make_shared<std::map<std::uint64_t, held>>();
  auto next = std::make_shared<std::uint64_t>(0);
  auto cut_left = [self, fleet, key]() -> runtime::duration {
    auto i = fleet->cut_until.find(key);
    auto now = self->clock().now();
    return i == fleet->cut_until.end() || i->second <= now ? runtime::duration{0}
                                                            : i->second - now;
  };
  return {
    [=](runtime::link_transfer& t) -> caf::result<runtime::link_delivery> {
      auto wait = cut_left();
      if (auto s = fleet->link_slow.find(key); s != fleet->link_slow.end() && !s->second.empty())
        wait += runtime::from_seconds((*s->second.rbegin() - 1.0)
                                      * static_cast<double>(t.bytes) / bandwidth);
      if (wait == runtime::duration{0})
        return self->delegate(inner, t);
      auto n = ++*next;
      auto rp = self->make_response_promise<runtime::link_delivery>();
      pending->emplace(n, held{t, rp});
      self->delayed_send(self, wait, link_retry_atom::value, n);
      return rp;
    },
    [=](link_retry_atom, std::uint64_t n) {
      auto i = pending->find(n);
      if (i == pending->end())
        return;
      if (auto wait = cut_left(); wait > runtime::duration{0}) {
        self->delayed_send(self, wait, link_retry_atom::value, n);
        return;
      }
      auto h = std::move(i->second);
      pending->erase(i);
      self->request(inner, caf::infinite, h.transfer)
        .then([rp = h.promise](runtime::link_delivery& d) mutable { rp.deliver(d); });
    },
  };
}

} // namespace

std::vector<std::uint32_t> incarnation_gpus(fleet_state& fleet, const std::string& key,
                                            std::uint32_t configured, std::uint32_t experts) {
  // An incarnation runs on the instance's healthy GPUs, rounded down to a valid EP size.
  auto& failed = fleet.failed[key];
  std::vector<std::uint32_t> healthy;
  for (std::uint32_t g = 0; g < configured; ++g)
    if (!failed.contains(g))
      healthy.push_back(g);
  auto n = resized_ep(configured, static_cast<std::uint32_t>(healthy.size()), experts);
  healthy.resize(n);
  auto previous = fleet.size.contains(key) ? fleet.size[key] : configured;
  if (fleet.starts[key]++ > 0) {
    if (n == 0) {
      fleet.event("stays_down", key,
                   {{"healthy_gpus", configured - failed.size()},
                    {"reason", "too few healthy GPUs to re-form an EP group (needs "
                                 + std::to_string((configured + 1) / 2) + ")"}});
    } else {
      fleet.event("restart", key, {{"ep", n}});
      if (n != previous) {
        auto placed = balanced_placement(experts, n);
        fleet.event("ep_resize", key,
                     {{"from", previous},
                      {"to", n},
                      {"experts_per_rank_max", placed.empty() ? 0 : placed.front()},
                      {"experts_per_rank_min", placed.empty() ? 0 : placed.back()}});
      }
    }
  }
  if (n > 0)
    fleet.size[key] = n;
  return healthy;
}

runtime::link_port spawn_faulty_link(caf::actor_system& sys, runtime::link_port inner,
                                     double bandwidth, std::shared_ptr<const fleet_state> fleet,
                                     std::string key) {
  return caf::actor_cast<runtime::link_port>(
    sys.spawn(faulty_link_fn, std::move(inner), bandwidth, std::move(fleet), std::move(key)));
}

planned_orders plan_fault_orders(const topology& topo, const std::vector<fault>& faults,
                                 runtime::duration started, std::shared_ptr<fleet_state> fleet,
                                 actors::kv_check_actor kv, const std::string& prefill_pool,
                                 const std::string& decode_pool) {
  std::vector<actors::fault_order> orders;
  std::vector<std::size_t> order_of_fault(faults.size(), SIZE_MAX);
  auto due = [&](runtime::duration at) { return std::max(runtime::duration{0}, at - started); };
  // An effect-only order at `at` (the end of a timed fault); not tied to a timeline entry.
  auto later = [&](runtime::duration at, std::function<void()> effect) {
    actors::fault_order order;
    order.at = due(at);
    order.effect = std::move(effect);
    orders.push_back(std::move(order));
  };
  auto instance_key = [](const fault_place& place) {
    return place.pool + "/" + std::to_string(*place.instance);
  };
  // The instances a gpu / instance / pool target covers ("pool/instance" keys).
  auto covered = [&](const fault_target& t) {
    std::vector<std::string> keys;
    if (t.kind == target_kind::pool) {
      for (auto& pool : topo.pools)
        if (pool.name == t.place.pool)
          for (std::uint32_t i = 0; i < pool.instances.max; ++i)
            keys.push_back(pool.name + "/" + std::to_string(i));
    } else if (t.place.instance) {
      keys.push_back(instance_key(t.place));
    }
    return keys;
  };
  // The KV links a partition cuts: a decode instance's ingress carries the prefill ->
  // decode hand-offs and drain forwards, a prefill instance's link the store -> device
  // fetches. An instance or pool target cuts its instances' links; a link target cuts the
  // ingress of its decode end(s) (the transfers between its two ends cross it; a decode
  // instance's ingress is shared by every sender, so all its hand-offs wait). A link with no
  // decode end carries no modelled transfer.
  auto partition_keys = [&](const fault_target& t) {
    std::vector<std::string> keys;
    auto role_of = [&](const std::string& pool) {
      for (auto& p : topo.pools)
        if (p.name == pool)
          return p.role;
      return pool_role::vision;
    };
    auto ends = [&](const fault_place& end) {
      fault_target one;
      one.kind = end.instance ? target_kind::instance : target_kind::pool;
      one.place = end;
      return covered(one);
    };
    if (t.kind == target_kind::instance || t.kind == target_kind::pool) {
      if (role_of(t.place.pool) != pool_role::vision)
        keys = covered(t);
    } else if (t.kind == target_kind::link) {
      for (auto* end : {&t.place, &t.peer})
        if (role_of(end->pool) == pool_role::decode)
          for (auto& k : ends(*end))
            keys.push_back(k);
    }
    return keys;
  };
  // Where the GPUs sit, for node targets (docs/faults.md, "Node targets"): with [[node]]
  // sections, each pool's instances in file order — first every pool's initial instances,
  // then the rest up to its max — take their GPUs in index order from the first node (in
  // file order) that serves the pool's role and has GPUs left. node -> ("pool/i", gpu).
  std::map<std::string, std::vector<std::pair<std::string, std::uint32_t>>> on_node;
  {
    std::vector<std::uint32_t> left;
    for (auto& n : topo.nodes)
      left.push_back(n.gpus);
    for (int pass = 0; pass < 2; ++pass)
      for (auto& pool : topo.pools) {
        auto lo = pass == 0 ? 0u : pool.instances.initial;
        auto hi = pass == 0 ? pool.instances.initial : pool.instances.max;
        for (auto i = lo; i < hi; ++i)
          for (std::uint32_t g = 0; g < pool.gpus_per_instance; ++g)
            for (std::size_t k = 0; k < topo.nodes.size(); ++k) {
              auto& roles = topo.nodes[k].roles;
              if (left[k] == 0 || std::find(roles.begin(), roles.end(), pool.role) == roles.end())
                continue;
              --left[k];
              on_node[topo.nodes[k].name].emplace_back(pool.name + "/" + std::to_string(i), g);
              break;
            }
      }
  }
  // The serving instances with a GPU on `node` ("pool/i", vision excluded: it has no modelled
  // steps to slow nor KV link to cut): a slow node slows each one's EP group (its collective
  // steps wait for the slowest rank), a partitioned node cuts each one's KV link.
  auto node_keys = [&](const std::string& node) {
    std::set<std::string> keys;
    for (auto& [key, gpu] : on_node[node]) {
      auto pool = key.substr(0, key.find('/'));
      for (auto& p : topo.pools)
        if (p.name == pool && p.role != pool_role::vision)
          keys.insert(key);
    }
    return std::vector<std::string>(keys.begin(), keys.end());
  };
  for (std::size_t i = 0; i < faults.size(); ++i) {
    auto& f = faults[i];
    auto& place = f.target.place;
    auto target = to_string(f.target);
    actors::fault_order order;
    order.at = due(f.at);
    auto line = " (fault plan line " + std::to_string(f.line) + ")";
    if (f.kind == fault_kind::drain && f.target.kind == target_kind::instance
        && place.instance
        && (place.pool == decode_pool || place.pool == prefill_pool)) {
      // A drain: the leave notice, then (decode) the hand-off, and the stop.
      order.path = {place.pool, instance_key(place)};
      order.drain = f.grace;
    } else if (f.kind == fault_kind::fail && f.target.kind == target_kind::gpu
               && place.instance && place.rank) {
      auto key = instance_key(place);
      auto gpu = *place.rank;
      order.path = {place.pool, key, "rank" + std::to_string(gpu)};
      order.reason = runtime::make_error(runtime::errc::unavailable, "gpu failure" + line);
      order.effect = [fleet, key, gpu] { fleet->failed[key].insert(gpu); };
      if (f.duration)
        later(f.at + *f.duration, [fleet, key, gpu, target] {
          fleet->failed[key].erase(gpu);
          fleet->event("recover", target, {{"after", "fail duration"}});
        });
    } else if ((f.kind == fault_kind::fail || f.kind == fault_kind::recover)
               && f.target.kind == target_kind::node && !on_node[f.target.node].empty()) {
      // A node: every GPU on it fails (each instance it hosts goes down) or recovers.
      auto gpus = on_node[f.target.node];
      auto down = f.kind == fault_kind::fail;
      auto mark = [fleet, gpus](bool failed) {
        for (auto& [key, gpu] : gpus)
          if (failed)
            fleet->failed[key].insert(gpu);
          else
            fleet->failed[key].erase(gpu);
      };
      order.effect = [mark, down] { mark(down); };
      if (down) {
        std::set<std::string> hosted;
        for (auto& [key, gpu] : gpus)
          hosted.insert(key);
        for (auto& key : hosted) {
          actors::fault_order exit;
          exit.at = order.at;
          exit.path = {key.substr(0, key.find('/')), key};
          exit.reason = runtime::make_error(runtime::errc::unavailable, "node failure" + line);
          orders.push_back(std::move(exit));
        }
        if (f.duration)
          later(f.at + *f.duration, [mark, fleet, target] {
            mark(false);
            fleet->event("recover", target, {{"after", "fail duration"}});
          });
      }
    } else if (f.kind == fault_kind::fail && f.target.kind == target_kind::instance
               && place.instance) {
      order.path = {place.pool, instance_key(place)};
      order.reason = runtime::make_error(runtime::errc::unavailable, "instance failure" + line);
    } else if (f.kind == fault_kind::fail && f.target.kind == target_kind::pool) {
      order.path = {place.pool, "*"};
      order.reason = runtime::make_error(runtime::errc::unavailable, "pool failure" + line);
    } else if (f.kind == fault_kind::recover && f.target.kind == target_kind::gpu
               && place.instance && place.rank) {
      auto key = instance_key(place);
      auto gpu = *place.rank;
      order.effect = [fleet, key, gpu] { fleet->failed[key].erase(gpu); };
    } else if (f.kind == fault_kind::slow && f.duration
               && (f.target.kind == target_kind::gpu || f.target.kind == target_kind::instance
                   || f.target.kind == target_kind::pool
                   || (f.target.kind == target_kind::node
                       && !node_keys(f.target.node).empty()))) {
      auto keys = f.target.kind == target_kind::node ? node_keys(f.target.node)
                                                     : covered(f.target);
      auto factor = f.factor;
      order.effect = [fleet, keys, factor] {
        for (auto& k : keys)
          fleet->slow[k].insert(factor);
      };
      later(f.at + *f.duration, [fleet, keys, factor, target] {
        for (auto& k : keys)
          if (auto it = fleet->slow[k].find(factor); it != fleet->slow[k].end())
            fleet->slow[k].erase(it);
        fleet->event("slow_end", target);
      });
    } else if (f.kind == fault_kind::slow && f.duration && f.target.kind == target_kind::link
               && !partition_keys(f.target).empty()) {
      // A slow link: the same KV links a partition of it would cut carry their transfers
      // `factor` times slower.
      auto keys = partition_keys(f.target);
      auto factor = f.factor;
      order.effect = [fleet, keys, factor] {
        for (auto& k : keys)
          fleet->link_slow[k].insert(factor);
      };
      later(f.at + *f.duration, [fleet, keys, factor, target] {
        for (auto& k : keys)
          if (auto it = fleet->link_slow[k].find(factor); it != fleet->link_slow[k].end())
            fleet->link_slow[k].erase(it);
        fleet->event("slow_end", target);
      });
    } else if (f.kind == fault_kind::partition && f.duration
               && !(f.target.kind == target_kind::node ? node_keys(f.target.node)
                                                       : partition_keys(f.target))
                     .empty()) {
      auto keys = f.target.kind == target_kind::node ? node_keys(f.target.node)
                                                     : partition_keys(f.target);
      auto d = *f.duration;
      order.effect = [fleet, keys, d] {
        auto until = fleet->clock->now() + d;
        for (auto& k : keys)
          fleet->cut_until[k] = std::max(fleet->cut_until[k], until);
      };
      later(f.at + d, [fleet, target] { fleet->event("partition_end", target); });
    } else if ((f.kind == fault_kind::store_fail || f.kind == fault_kind::recover)
               && f.target.kind == target_kind::shard) {
      auto shard = f.target.shard;
      auto down = f.kind == fault_kind::store_fail;
      order.effect = [kv, shard, down] {
        caf::anon_send(kv, actors::kv_shard_fault_atom::value, shard, down);
      };
      if (down && f.duration)
        later(f.at + *f.duration, [kv, shard, fleet, target] {
          caf::anon_send(kv, actors::kv_shard_fault_atom::value, shard, false);
          fleet->event("recover", target, {{"after", "store_fail duration"}});
        });
    } else if (f.kind == fault_kind::store_slow && f.duration
               && f.target.kind == target_kind::shard) {
      // Every operation the shard answers takes factor times its modelled latency.
      auto shard = f.target.shard;
      auto factor = f.factor;
      order.effect = [kv, shard, factor] {
        caf::anon_send(kv, actors::kv_shard_slow_atom::value, shard, factor, true);
      };
      later(f.at + *f.duration, [kv, shard, factor, fleet, target] {
        caf::anon_send(kv, actors::kv_shard_slow_atom::value, shard, factor, false);
        fleet->event("slow_end", target);
      });
    } else {
      continue;
    }
    order_of_fault[i] = orders.size();
    orders.push_back(std::move(order));
  }
  return planned_orders{std::move(orders), std::move(order_of_fault)};
}

} // namespace troupe::cluster::sim

#include "cluster/launch/real_faults.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

namespace troupe::cluster {

namespace {

using namespace std::chrono_literals;

/// The processes of pool `pool_name`'s instances `instance` (all when empty); nothing for a
/// pool that does not run as processes.
std::vector<std::string> pool_processes(const topology& topo, const std::string& pool_name,
                                        std::optional<std::uint32_t> instance) {
  auto pool = std::find_if(topo.pools.begin(), topo.pools.end(),
                           [&](const pool_spec& p) { return p.name == pool_name; });
  if (pool == topo.pools.end()
      || (pool->role != pool_role::prefill && pool->role != pool_role::decode))
    return {};
  std::vector<std::string> out;
  for (std::uint32_t i = 0; i < pool->instances.initial; ++i)
    if (!instance || *instance == i)
      out.push_back(std::string(to_string(pool->role)) + "/" + std::to_string(i));
  return out;
}

const pool_spec* pool_named(const topology& topo, const std::string& pool_name) {
  auto pool = std::find_if(topo.pools.begin(), topo.pools.end(),
                           [&](const pool_spec& p) { return p.name == pool_name; });
  return pool == topo.pools.end() ? nullptr : &*pool;
}

std::string describe(const sim::fault& f) {
  char at[32];
  std::snprintf(at, sizeof at, "%.1fs", runtime::to_seconds(f.at));
  return std::string(at) + " " + std::string(sim::to_string(f.kind)) + " "
         + sim::to_string(f.target);
}

} // namespace

std::string to_string(process_action_kind k) {
  switch (k) {
    case process_action_kind::kill: return "kill";
    case process_action_kind::release: return "release";
    case process_action_kind::stop: return "stop";
    case process_action_kind::resume: return "resume";
    case process_action_kind::term: return "term";
    case process_action_kind::cut: return "cut";
    case process_action_kind::slow: return "slow";
    case process_action_kind::fail_gpu: return "fail_gpu";
    case process_action_kind::heal_gpu: return "heal_gpu";
  }
  return "?";
}

std::string store_process_name(std::uint32_t index, std::uint32_t shards) {
  return shards <= 1 ? std::string("store") : "store/" + std::to_string(index);
}

real_fault_plan plan_real_faults(const std::vector<sim::fault>& timeline, const topology& topo,
                                 bool store_process, bool hosts) {
  real_fault_plan out;
  for (std::size_t i = 0; i < timeline.size(); ++i) {
    const auto& f = timeline[i];
    auto skip = [&](const std::string& why) { out.not_executed.push_back(describe(f) + ": " + why); };
    // The processes the target names.
    std::vector<std::string> procs;
    using sim::target_kind;
    switch (f.target.kind) {
      case target_kind::gpu:
      case target_kind::instance:
        procs = pool_processes(topo, f.target.place.pool, f.target.place.instance);
        break;
      case target_kind::pool:
        procs = pool_processes(topo, f.target.place.pool, std::nullopt);
        break;
      case target_kind::node: {
        auto node = std::find_if(topo.nodes.begin(), topo.nodes.end(),
                                 [&](const node_spec& n) { return n.name == f.target.node; });
        if (node != topo.nodes.end())
          for (const auto& pool : topo.pools)
            if (std::find(node->roles.begin(), node->roles.end(), pool.role) != node->roles.end())
              for (auto& p : pool_processes(topo, pool.name, std::nullopt))
                procs.push_back(std::move(p));
        break;
      }
      case target_kind::shard:
        if (store_process) {
          const auto shards = topo.storage.real_shards();
          procs.push_back(store_process_name(f.target.shard % shards, shards));
        }
        break;
      case target_kind::link:
      case target_kind::none:
        break;
    }
    // A gpu of an instance of several GPUs: the instance re-forms without it when it fails;
    // stopped or slowed, it is that GPU's rank that stops (process_action::gpu).
    const auto* pool = pool_named(topo, f.target.place.pool);
    const auto configured = pool != nullptr ? pool->gpus_per_instance : 0;
    const bool ep_gpu = f.target.kind == target_kind::gpu && f.target.place.rank && configured > 1;
    auto act = [&](runtime::duration at, process_action_kind k) {
      for (const auto& p : procs) {
        out.actions.push_back(process_action{at, k, p, i, {}, {}});
        if (ep_gpu) {
          out.actions.back().gpu = *f.target.place.rank;
          out.actions.back().configured = configured;
          out.actions.back().ranks_per_process = pool->ranks_per_process;
        }
      }
    };
    // A slowdown by f.factor: of each 200 ms period, stopped for 1 − 1/factor of it.
    auto duty_cycle = [&] {
      if (f.factor <= 1) {
        skip("a factor of at most 1 slows nothing");
        return;
      }
      const runtime::duration period = std::chrono::duration_cast<runtime::duration>(200ms);
      auto stopped = std::chrono::duration_cast<runtime::duration>(
        period * (1.0 - 1.0 / f.factor));
      auto end = f.at + f.duration.value_or(runtime::duration{0});
      for (auto t = f.at; t < end; t += period) {
        act(t, process_action_kind::stop);
        act(std::min(t + stopped, end), process_action_kind::resume);
      }
    };
    // A link fault: one action per pair of its ends' processes, carried out between their
    // hosts.
    auto link = [&](process_action_kind k) {
      if (!hosts) {
        skip(std::string("a link ") + (k == process_action_kind::cut ? "partition" : "slowdown")
             + " needs hosts of their own (--hosts): the processes of one host share its "
               "loopback");
        return;
      }
      auto ends = [&](const sim::fault_place& p) {
        return pool_processes(topo, p.pool, p.instance);
      };
      auto peers = ends(f.target.peer);
      auto near = ends(f.target.place);
      if (near.empty() || peers.empty()) {
        skip("an end of the link has no process of a launched cluster");
        return;
      }
      for (const auto& a : near)
        for (const auto& b : peers)
          if (a != b)
            out.actions.push_back(process_action{f.at, k, a, i, b,
                                                 f.duration.value_or(runtime::duration{0}),
                                                 f.factor});
    };
    auto act_gpu = [&](runtime::duration at, process_action_kind k) {
      for (const auto& p : procs)
        out.actions.push_back(process_action{at, k, p, i, {}, {}, 1, *f.target.place.rank,
                                             configured, pool->ranks_per_process});
    };
    switch (f.kind) {
      case sim::fault_kind::fail:
        if (!procs.empty() && ep_gpu) {
          act_gpu(f.at, process_action_kind::fail_gpu);
          if (f.duration)
            act_gpu(f.at + *f.duration, process_action_kind::heal_gpu);
          break;
        }
        if (procs.empty()) {
          skip("no process of a launched cluster is its target");
          break;
        }
        act(f.at, process_action_kind::kill);
        // Down for its duration; without one, a failed gpu or node stays down until a
        // `recover`, a failed instance or pool is restarted as its supervisor would.
        if (f.duration)
          act(f.at + *f.duration, process_action_kind::release);
        else if (f.target.kind == target_kind::instance || f.target.kind == target_kind::pool)
          act(f.at, process_action_kind::release);
        break;
      case sim::fault_kind::recover:
        if (procs.empty()) {
          skip("no process of a launched cluster is its target");
          break;
        }
        if (ep_gpu)
          act_gpu(f.at, process_action_kind::heal_gpu);
        else
          act(f.at, process_action_kind::release);
        break;
      case sim::fault_kind::partition:
        if (f.target.kind == target_kind::link) {
          link(process_action_kind::cut);
          break;
        }
        if (procs.empty()) {
          skip("no process of a launched cluster is its target");
          break;
        }
        act(f.at, process_action_kind::stop);
        act(f.at + f.duration.value_or(runtime::duration{0}), process_action_kind::resume);
        break;
      case sim::fault_kind::slow:
        if (f.target.kind == target_kind::link) {
          if (f.factor <= 1)
            skip("a factor of at most 1 slows nothing");
          else
            link(process_action_kind::slow);
          break;
        }
        if (procs.empty()) {
          skip("no process of a launched cluster is its target");
          break;
        }
        duty_cycle();
        break;
      case sim::fault_kind::drain:
        if (procs.empty()) {
          skip("no process of a launched cluster is its target");
          break;
        }
        act(f.at, process_action_kind::term);
        break;
      case sim::fault_kind::surge:
        skip("traffic comes from the clients of a real cluster");
        break;
      case sim::fault_kind::store_fail:
        if (procs.empty()) {
          skip("the cluster has no block store");
          break;
        }
        // Down for its duration, else until a `recover` of the shard (as in the simulator).
        act(f.at, process_action_kind::kill);
        if (f.duration)
          act(f.at + *f.duration, process_action_kind::release);
        break;
      case sim::fault_kind::store_slow:
        if (procs.empty()) {
          skip("the cluster has no block store");
          break;
        }
        duty_cycle();
        break;
    }
  }
  std::stable_sort(out.actions.begin(), out.actions.end(),
                   [](const process_action& a, const process_action& b) { return a.at < b.at; });
  return out;
}

} // namespace troupe::cluster

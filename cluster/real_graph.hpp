// real_graph: the serving graph of one machine's real world, built from a topology.
//
// `troupe serve` and the tests of the real world need the same graph: the KV CHECK role, the
// prefill and decode balancers, a pool supervisor per role with its instances (engine + one
// rank on one device), and the generation service that spawns a request actor per API
// request. The devices come from a factory, so the CPU engine (ports/cpu_device.hpp) serves in
// production and a scripted device (ports/script_device.hpp) or a fault-injecting wrapper can
// stand in for tests; the actors are the simulator's own.
#pragma once

#include "actors/autoscaler/autoscaler.hpp"
#include "actors/engine/decode_engine.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/lb/decode_lb.hpp"
#include "actors/lb/prefill_lb.hpp"
#include "actors/request/generation_service.hpp"
#include "cluster/topology.hpp"
#include "runtime/metrics.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/store.hpp"
#include "runtime/supervisor.hpp"

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace troupe::cluster {

/// Ranks each instance has lost for good: a process of some of its ranks died
/// (ports::cpu_device_params::on_ranks_lost, reported from the devices' threads). Its later
/// incarnations run on the ranks left, resized by the simulator's rule.
class rank_losses {
 public:
  /// Called (from the instance's actor) with the EP size an incarnation of an instance that
  /// lost ranks forms.
  using formed_fn = std::function<void(pool_role, std::uint32_t instance, std::uint32_t ranks)>;

  void lose(pool_role role, std::uint32_t instance, std::uint32_t ranks);
  std::uint32_t lost(pool_role role, std::uint32_t instance) const;
  void on_formed(formed_fn f);
  void formed(pool_role role, std::uint32_t instance, std::uint32_t ranks) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<pool_role, std::uint32_t>, std::uint32_t> lost_;
  formed_fn formed_;
};

struct real_graph_params {
  /// Makes the device of an instance of pool `pool` (role prefill or decode) whose
  /// incarnation has `ranks` ranks (the pool's gpus_per_instance): one device runs them all,
  /// as an EP group of that many ranks (ports::cpu_device_params::ep_ranks), and each rank
  /// actor of the instance watches it.
  std::function<runtime::device_port(caf::actor_system&, pool_role role, std::uint32_t instance,
                                     std::uint32_t ranks)>
    device;
  /// KV bytes of one 128-token block of the model (the CHECK role's accounting).
  std::uint64_t block_bytes = 0;
  /// The GPUs (ranks below the pool's gpus_per_instance, ascending) the instances may run on;
  /// empty: all. An incarnation runs on the first resized_ep(gpus_per_instance, healthy,
  /// experts) of them (cluster/sim/expert_placement.hpp: the simulator's EP resize rule), and
  /// with none that make a valid size it cannot start (its pool supervisor retries).
  std::vector<std::uint32_t> healthy_gpus;
  /// Ranks the instances lost (their devices report into it: see `device`); null: none are.
  std::shared_ptr<rank_losses> losses;
  /// The model's routed experts (the resize rule's limit; 0: none).
  std::uint32_t experts = 0;
  /// Longest prompt accepted (tokens).
  std::uint64_t max_context = 1 << 20;
  /// Requests decoded together by a decode instance.
  std::uint32_t max_batch = 64;
  /// KV tokens a decode instance holds: decode_lb books each request's context and output
  /// budget against it, and a request finds no room until bookings end (serve --kv-tokens);
  /// 0: the balancer's default (64M: the batch limits first).
  std::uint64_t decode_kv_tokens = 0;
  /// Prompt tokens per prefill step.
  std::uint64_t prefill_chunk = 512;
  /// Speculative decoding on the decode instances, and DSpark's step-time curve (a decode
  /// device's profile).
  actors::speculation_setting spec;
  /// Overlapped scheduling on the decode instances (decode_engine_params::overlap).
  bool overlap = true;
  /// The devices keep window states (serve --window-memory above 0): the engines tell the
  /// prefill balancer where (prefill_kept), and decode steps set states aside. False: nobody
  /// is told, so no job asks another instance for a state it cannot have.
  bool keep_windows = true;
  runtime::step_cost_fn step_cost;
  /// Receives every request_outcome (may be invalid).
  caf::actor outcomes;
  /// The cluster KV cache's block store (ports/posix_store.hpp). Invalid: no store — prompts
  /// are computed in full and nothing persists.
  runtime::store_port store;
  /// The parent of every chain's first block: names the model, so blocks of another model's
  /// KV (a store directory reused after a model change) never match (block_key.hpp).
  actors::block_key chain_root;
  /// The instances are processes of their own with KV bridges over a fabric (`troupe
  /// launch`): requests book their decode instance as their prefill begins, so that the
  /// prompt's blocks cross while the rest computes (request_services::stream_kv).
  bool stream_kv = false;
  /// Where the KV CHECK role, decode_lb and the requests record what they do, for a checker
  /// (actors/history.hpp; `troupe serve --check-history`); null: nothing is recorded.
  actors::run_history_ptr history;
  /// Where the autoscaler (with the topology's on) reports each decision, as the
  /// troupe_autoscaler_* families; null: nowhere. Must outlive the graph.
  runtime::registry* metrics = nullptr;
};

struct real_graph {
  actors::kv_check_actor kv;
  actors::prefill_lb_actor prefill_lb;
  actors::decode_lb_actor decode_lb;
  /// The root supervisor of the pools (send it an exit to stop them).
  caf::actor cluster;
  actors::generation_service service;
};

/// The control part of the graph: the KV CHECK role, the balancers and the generation
/// service (the part `troupe node --role control` runs; instances join from elsewhere).
struct control_graph {
  actors::kv_check_actor kv;
  actors::prefill_lb_actor prefill_lb;
  actors::decode_lb_actor decode_lb;
  actors::generation_service service;
};

/// Checks that `topo` can run on one machine's real world: a prefill and a decode pool, one
/// device per instance. Returns an error message naming the file, or empty.
std::string check_real_topology(const topology& topo);

/// Spawns the control part of the graph of a topology that passed check_real_topology (with
/// a store, its CHECK role is first filled as spawn_real_graph says). Instances join its
/// balancers by announcing their engines (actors/instance.hpp), from this process or another.
control_graph spawn_control_graph(caf::actor_system& sys, const topology& topo,
                                  const real_graph_params& params,
                                  std::chrono::seconds wait = std::chrono::seconds(60));

/// The supervisor of pool `role` (prefill or decode) of `topo` with the instances numbered
/// `instances` (each one rank on one device from params.device), announcing their engines to
/// `lb` (that pool's balancer, or an actor that forwards to it) and, with params.store,
/// persisting blocks through the CHECK role `kv` and (decode) reporting the window states its
/// devices keep to `kept_to` (the prefill balancer, or an actor that forwards to it).
runtime::supervisor_config pool_supervisor_config(const topology& topo, pool_role role,
                                                  const real_graph_params& params,
                                                  const actors::kv_check_actor& kv,
                                                  const caf::actor& lb,
                                                  const std::vector<std::uint32_t>& instances,
                                                  const caf::actor& kept_to = {});

/// Indexes the blocks `store` holds in the CHECK role `kv` (as hits of the chatbot class: the
/// store's own expiry stays authoritative, a fetch of an expired block misses), waiting up to
/// `wait` for each answer. When the store does not answer, the index is left as it was.
void index_stored_blocks(caf::actor_system& sys, const runtime::store_port& store,
                         const actors::kv_check_actor& kv, std::chrono::seconds wait);

/// The autoscaler of the real world (`troupe serve`, and the control process of `troupe
/// launch`): the topology's interval and limits; no machines to acquire (an instance ordered
/// starts at once, an inventory slot refills at once); decode capacity params.max_batch
/// requests, prefill capacity measured on the engines (never short before); the decisions'
/// figures in params.metrics when set. `root` is left for the caller: the supervisor whose
/// children are the pools, or their stand-ins.
actors::autoscaler_params real_autoscaler_params(
  const topology& topo, const real_graph_params& params, const actors::prefill_lb_actor& prefill_lb,
  const actors::decode_lb_actor& decode_lb,
  std::function<runtime::child_spec(actors::instance_id)> make_prefill,
  std::function<runtime::child_spec(actors::instance_id)> make_decode);

/// Spawns the graph of a topology that passed check_real_topology. With the topology's
/// autoscaler on, the pools grow and shrink as in the simulation (actors/autoscaler: the same
/// actor and policy, docs/autoscaler.md), an instance ordered starting at once. With a store,
/// the CHECK role's index is first filled with the blocks the store holds (a restart finds the
/// blocks written before it); that waits for the store's answer, up to `wait`, and on failure
/// the index starts empty (the cache is an optimisation: the graph serves without it).
real_graph spawn_real_graph(caf::actor_system& sys, const topology& topo,
                            const real_graph_params& params,
                            std::chrono::seconds wait = std::chrono::seconds(60));

} // namespace troupe::cluster

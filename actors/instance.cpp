#include "actors/instance.hpp"

#include "actors/gpu_rank.hpp"

#include <caf/local_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <memory>
#include <vector>

namespace troupe::actors {

namespace {

using rank_table = std::shared_ptr<std::vector<runtime::device_port>>;

/// The rank children of one incarnation on `gpus`; each start records the rank's device in
/// `table` (position 0 is the leader's, which the engine steps: straight to the device, not
/// through the rank, so that a step costs one message less; the rank owns and watches its
/// device, and its exit takes the instance down).
std::vector<runtime::child_spec> rank_children(instance_id id, const std::vector<std::uint32_t>& gpus,
                                               const instance_ports& ports, rank_table table) {
  std::vector<runtime::child_spec> children;
  auto size = static_cast<std::uint32_t>(gpus.size());
  table->resize(size);
  for (std::uint32_t r = 0; r < size; ++r) {
    runtime::child_spec spec;
    spec.id = "rank" + std::to_string(gpus[r]);
    spec.shutdown = std::chrono::seconds(1);
    spec.start = [id, r, size, gpu = gpus[r], device = ports.device, table](caf::local_actor* self) {
      auto dev = device(self, id, r, size);
      auto rank = spawn_gpu_rank(self, gpu_rank_params{id, gpu}, dev);
      (*table)[r] = std::move(dev);
      return caf::actor_cast<caf::actor>(rank);
    };
    children.push_back(std::move(spec));
  }
  return children;
}

/// The child spec of an instance named `name`: at every (re)start it asks `ports.gpus` which
/// GPUs to run on, then starts a one_for_all supervisor (intensity 0: the first failure of
/// any child takes the whole instance down) of its ranks and of what `more(cfg, table, size)`
/// adds (the engine, the block writer).
template <class More>
runtime::child_spec elastic_instance(std::string name, instance_id id, std::uint32_t ranks,
                                     instance_ports ports, More more) {
  runtime::child_spec spec;
  spec.id = name;
  spec.restart = runtime::restart_policy::permanent;
  spec.shutdown = runtime::infinite_grace;
  spec.start = [name, id, ranks, ports, more](caf::local_actor* self) -> caf::actor {
    std::vector<std::uint32_t> gpus;
    if (ports.gpus) {
      gpus = ports.gpus(id);
    } else {
      for (std::uint32_t g = 0; g < ranks; ++g)
        gpus.push_back(g);
    }
    if (gpus.empty())
      return {};
    auto table = std::make_shared<std::vector<runtime::device_port>>();
    runtime::supervisor_config cfg{name,
                                   {runtime::strategy::one_for_all, 0, std::chrono::seconds(1)},
                                   rank_children(id, gpus, ports, table)};
    more(cfg, table, static_cast<std::uint32_t>(gpus.size()));
    return runtime::supervisor_child(std::move(cfg)).start(self);
  };
  return spec;
}

/// `x` scaled by `size / ranks` (at least 1).
template <class T>
T scaled(T x, std::uint32_t size, std::uint32_t ranks) {
  if (size >= ranks || ranks == 0)
    return x;
  return std::max<T>(1, static_cast<T>(static_cast<std::uint64_t>(x) * size / ranks));
}

/// The engine child of instance `id`: `spawn(self)` makes the engine, which is then announced
/// to its balancer `lb` (the balancer monitors it from there on).
template <class Lb, class Spawn>
runtime::child_spec engine_child(instance_id id, Lb lb, Spawn spawn) {
  runtime::child_spec spec;
  spec.id = "engine";
  spec.start = [id, lb, spawn](caf::local_actor* self) {
    auto e = spawn(self);
    caf::anon_send(lb, add_instance_atom::value, id, e);
    return caf::actor_cast<caf::actor>(e);
  };
  return spec;
}

} // namespace

runtime::child_spec prefill_instance(std::string pool, instance_id id, std::uint32_t ranks,
                                     prefill_engine_params engine, instance_ports ports,
                                     prefill_lb_actor lb, bool report_kept) {
  engine.instance = id;
  auto link = ports.link;
  return elastic_instance(
    pool + "/" + std::to_string(id), id, ranks, std::move(ports),
    [engine, link, id, lb, ranks, report_kept](runtime::supervisor_config& cfg,
                                               const rank_table& table, std::uint32_t size) {
      auto e = engine;
      e.step_tokens = scaled(e.step_tokens, size, ranks);
      // The balancer learns which prefix window states the instance's device keeps.
      if (report_kept)
        e.kept = [lb, id](const block_key& key) { caf::anon_send(lb, prefill_kept{id, key}); };
      cfg.children.push_back(engine_child(id, lb, [e, link, table, id, lb](caf::local_actor* self) {
        auto l = link ? link(self, id) : runtime::link_port{};
        // On a drain notice the engine has its balancer exclude the instance.
        auto leave = [lb, id] { caf::anon_send(lb, drain_instance_atom::value, id); };
        return spawn_prefill_engine(self, e, table->at(0), l, leave);
      }));
    });
}

runtime::child_spec decode_instance(std::string pool, instance_id id, std::uint32_t ranks,
                                    decode_engine_params engine, instance_ports ports,
                                    decode_lb_actor lb, block_writer_params writer,
                                    caf::actor kept_to) {
  engine.instance = id;
  writer.instance = id;
  // The prefill balancer learns which prefix window states the instance's device keeps.
  if (kept_to && writer.store)
    engine.kept = [kept_to, id](const block_key& key, const caf::actor& engine) {
      caf::anon_send(kept_to,
                     prefill_kept{id, key, caf::actor_cast<caf::strong_actor_ptr>(engine)});
    };
  auto link = ports.link;
  return elastic_instance(
    pool + "/" + std::to_string(id), id, ranks, std::move(ports),
    [engine, link, id, lb, writer, ranks](runtime::supervisor_config& cfg,
                                          const rank_table& table, std::uint32_t size) {
      // The engine's block sinks send each step's filled blocks to this incarnation's writer.
      block_sink persist;
      store_sink store;
      if (writer.kv) {
        auto slot = std::make_shared<block_writer_actor>();
        runtime::child_spec w;
        w.id = "block_writer";
        w.start = [writer, slot](caf::local_actor* self) {
          *slot = spawn_block_writer(self, writer);
          return caf::actor_cast<caf::actor>(*slot);
        };
        cfg.children.push_back(std::move(w));
        persist = [slot](const std::vector<filled_blocks>& filled) {
          if (*slot)
            caf::anon_send(*slot, persist_blocks{filled});
        };
        if (writer.store)
          store = [slot](store_blocks blocks) {
            if (*slot)
              caf::anon_send(*slot, std::move(blocks));
          };
      }
      auto e = engine;
      e.max_batch = scaled(e.max_batch, size, ranks);
      cfg.children.push_back(
        engine_child(id, lb, [e, link, table, id, persist, store, lb](caf::local_actor* self) {
          auto l = link ? link(self, id) : runtime::link_port{};
          // On a drain notice the engine has its balancer exclude the instance.
          auto leave = [lb, id] { caf::anon_send(lb, drain_instance_atom::value, id); };
          return spawn_decode_engine(self, e, table->at(0), l, persist, leave, store);
        }));
    });
}

runtime::child_spec vision_instance(std::string pool, instance_id id, std::uint32_t ranks,
                                    vision_engine_params engine, instance_ports ports,
                                    vision_lb_actor lb) {
  engine.instance = id;
  return elastic_instance(
    pool + "/" + std::to_string(id), id, ranks, std::move(ports),
    [engine, id, lb, ranks](runtime::supervisor_config& cfg, const rank_table& table,
                            std::uint32_t size) {
      auto e = engine;
      e.step_images = scaled(e.step_images, size, ranks);
      cfg.children.push_back(engine_child(id, lb, [e, table](caf::local_actor* self) {
        return spawn_vision_engine(self, e, table->at(0));
      }));
    });
}

} // namespace troupe::actors

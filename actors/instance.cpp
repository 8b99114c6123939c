#include "actors/instance.hpp"

#include "actors/gpu_rank.hpp"

#include <caf/local_actor.hpp>
#include <caf/send.hpp>

#include <memory>
#include <vector>

namespace troupe::actors {

namespace {

using rank_table = std::shared_ptr<std::vector<runtime::device_port>>;

/// The rank children of an instance; each start records its handle in `table`.
std::vector<runtime::child_spec> rank_children(instance_id id, std::uint32_t ranks,
                                               const instance_ports& ports, rank_table table) {
  std::vector<runtime::child_spec> children;
  table->resize(ranks);
  for (std::uint32_t r = 0; r < ranks; ++r) {
    runtime::child_spec spec;
    spec.id = "rank" + std::to_string(r);
    spec.shutdown = std::chrono::seconds(1);
    spec.start = [id, r, device = ports.device, table](caf::local_actor* self) {
      auto rank = spawn_gpu_rank(self, gpu_rank_params{id, r}, device(self, id, r));
      (*table)[r] = rank;
      return caf::actor_cast<caf::actor>(rank);
    };
    children.push_back(std::move(spec));
  }
  return children;
}

runtime::supervisor_config instance_config(std::string name, instance_id id,
                                           std::uint32_t ranks, const instance_ports& ports,
                                           rank_table table) {
  // Intensity 0: the first failure of any child takes the whole instance down.
  runtime::supervisor_config cfg{std::move(name),
                                 {runtime::strategy::one_for_all, 0, std::chrono::seconds(1)},
                                 rank_children(id, ranks, ports, table)};
  return cfg;
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
                                     prefill_lb_actor lb) {
  auto table = std::make_shared<std::vector<runtime::device_port>>();
  auto cfg = instance_config(pool + "/" + std::to_string(id), id, ranks, ports, table);
  engine.instance = id;
  cfg.children.push_back(engine_child(id, lb, [engine, ports, table, id](caf::local_actor* self) {
    auto link = ports.link ? ports.link(self, id) : runtime::link_port{};
    return spawn_prefill_engine(self, engine, table->at(0), link);
  }));
  return runtime::supervisor_child(std::move(cfg));
}

runtime::child_spec decode_instance(std::string pool, instance_id id, std::uint32_t ranks,
                                    decode_engine_params engine, instance_ports ports,
                                    decode_lb_actor lb, block_writer_params writer) {
  auto table = std::make_shared<std::vector<runtime::device_port>>();
  auto cfg = instance_config(pool + "/" + std::to_string(id), id, ranks, ports, table);
  // The engine's block sink sends each step's filled blocks to the writer that is current
  // (the slot is refilled when the instance restarts).
  auto slot = std::make_shared<block_writer_actor>();
  block_sink persist;
  if (writer.kv) {
    writer.instance = id;
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
  }
  engine.instance = id;
  cfg.children.push_back(
    engine_child(id, lb, [engine, ports, table, id, persist, lb](caf::local_actor* self) {
      auto link = ports.link ? ports.link(self, id) : runtime::link_port{};
      // On a drain notice the engine has its balancer exclude the instance.
      auto leave = [lb, id] { caf::anon_send(lb, drain_instance_atom::value, id); };
      return spawn_decode_engine(self, engine, table->at(0), link, persist, leave);
    }));
  return runtime::supervisor_child(std::move(cfg));
}

runtime::child_spec vision_instance(std::string pool, instance_id id, std::uint32_t ranks,
                                    vision_engine_params engine, instance_ports ports,
                                    vision_lb_actor lb) {
  auto table = std::make_shared<std::vector<runtime::device_port>>();
  auto cfg = instance_config(pool + "/" + std::to_string(id), id, ranks, ports, table);
  engine.instance = id;
  cfg.children.push_back(engine_child(id, lb, [engine, table](caf::local_actor* self) {
    return spawn_vision_engine(self, engine, table->at(0));
  }));
  return runtime::supervisor_child(std::move(cfg));
}

} // namespace troupe::actors

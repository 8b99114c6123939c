#include "actors/type_ids.hpp"
#include "actors/wire_type_ids.hpp"

#include "actors/engine/vision_engine.hpp"
#include "actors/kv/block_key.hpp"
#include "actors/kv/block_writer.hpp"
#include "actors/kv/kv_index.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/lb/vision_lb.hpp"

#include <caf/actor_system_config.hpp>

namespace troupe::actors {

void register_actor_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::troupe_actors>();
  cfg.add_message_types<caf::id_block::troupe_actors_wire>();
}

} // namespace troupe::actors

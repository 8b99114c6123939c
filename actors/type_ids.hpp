// The CAF type-id block of troupe's actor messages, and their registration.
//
// Every message an actor of `actors/` sends gets a stable type id and name (so the CAF
// middleman can serialize it between nodes and logs can print it). The block starts where the
// runtime's ends; a later layer starts at `actors_type_ids_end`. Pass `register_actor_types`
// to `world_options::configure` (or call it from your own configure function).
#pragma once

#include "runtime/type_ids.hpp"

#include <caf/fwd.hpp>
#include <caf/type_id.hpp>

namespace troupe::actors {
struct block_key;
struct kv_match;
struct kv_match_result;
struct kv_insert;
struct kv_reserve;
struct kv_insert_result;
struct kv_commit;
struct kv_commit_result;
struct kv_touch;
struct kv_stats;
struct vision_job;
struct vision_done;
struct vision_route;
struct vision_assignment;
struct vision_release;
struct filled_blocks;
struct persist_blocks;
struct block_writer_stats;
} // namespace troupe::actors

CAF_BEGIN_TYPE_ID_BLOCK(troupe_actors, troupe::runtime::runtime_type_ids_end)
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::block_key))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_match))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_match_result))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_insert))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_reserve))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_insert_result))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_commit))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_commit_result))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_touch))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::kv_stats))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::vision_job))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::vision_done))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::vision_route))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::vision_assignment))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::vision_release))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::filled_blocks))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::persist_blocks))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::block_writer_stats))
CAF_END_TYPE_ID_BLOCK(troupe_actors)

namespace troupe::actors {
/// The first type id free for the next layer's block.
constexpr caf::type_id_t actors_type_ids_end = caf::id_block::troupe_actors::end;

/// Registers every message type of `actors/` (the block above and wire_type_ids.hpp's) with
/// `cfg`. Call it before the actor system starts, e.g. from world_options::configure.
void register_actor_types(caf::actor_system_config& cfg);
} // namespace troupe::actors

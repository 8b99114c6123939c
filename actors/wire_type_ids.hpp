// The CAF type-id block of the engine messages that cross processes in `troupe launch`.
//
// Inside one process every message may be any C++ type; between processes CAF's middleman
// serialises each message element by its registered name, so every element a request actor
// exchanges with an engine in another process (jobs, their answers, progress notices, stats,
// the engine handles instances announce to their balancers, the window states instances report
// keeping and pull from each other) needs a name here. The
// block follows troupe_actors' (type_ids.hpp); `register_actor_types` registers both. The
// in-process KV handles these messages carry (prefill_done::kv, decode_job::kv,
// decode_done::kv) are not serialised: across processes the bytes move over the link port.
#pragma once

#include "actors/engine/decode_engine.hpp"
#include "actors/engine/prefill_engine.hpp"
#include "actors/type_ids.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(troupe_actors_wire, troupe::actors::actors_type_ids_end)
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::prefill_job))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::prefill_done))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::decode_job))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::decode_progress))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::decode_done))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::engine_stats))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::prefill_engine_actor))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::decode_engine_actor))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::prefill_kept))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::kept_state_get))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::kept_state))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::kv_part))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::kv_part_offered))
CAF_ADD_TYPE_ID(troupe_actors_wire, (troupe::actors::kv_part_streamed))
CAF_END_TYPE_ID_BLOCK(troupe_actors_wire)

namespace troupe::actors {
/// The first type id free for the next layer's block.
constexpr caf::type_id_t actors_wire_type_ids_end = caf::id_block::troupe_actors_wire::end;
} // namespace troupe::actors

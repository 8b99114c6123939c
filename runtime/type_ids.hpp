// The CAF type-id block of troupe's runtime messages.
//
// Every message type that may cross a process boundary gets a stable type id and name, so
// that the CAF middleman can serialize it and logs can print it. Later layers (actors,
// cluster) append their own blocks after this one: `runtime_type_ids_end` is where the next
// block starts. `world` registers every block it is given.
#pragma once

#include <caf/type_id.hpp>

namespace troupe::runtime {
struct supervisor_event;
struct child_info;
struct device_step;
struct device_result;
struct link_transfer;
struct link_delivery;
struct store_put;
struct store_get;
struct store_has;
struct store_delete;
struct store_object;
struct store_stats;
struct store_key;
struct store_list;
struct store_entry;
struct fabric_ticket;
struct fabric_offer;
struct fabric_withdraw;
struct fabric_pull;
struct fabric_pulled;
struct fabric_activity;
} // namespace troupe::runtime

#include <vector>

CAF_BEGIN_TYPE_ID_BLOCK(troupe_runtime, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::supervisor_event))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::child_info))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::device_step))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::device_result))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::link_transfer))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::link_delivery))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_put))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_get))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_has))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_delete))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_object))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_stats))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_key))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_list))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::store_entry))
CAF_ADD_TYPE_ID(troupe_runtime, (std::vector<troupe::runtime::store_entry>))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::fabric_ticket))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::fabric_offer))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::fabric_withdraw))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::fabric_pull))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::fabric_pulled))
CAF_ADD_TYPE_ID(troupe_runtime, (troupe::runtime::fabric_activity))
CAF_END_TYPE_ID_BLOCK(troupe_runtime)

namespace troupe::runtime {
/// The first type id free for the next layer's block.
constexpr caf::type_id_t runtime_type_ids_end = caf::id_block::troupe_runtime::end;
} // namespace troupe::runtime

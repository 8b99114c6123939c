// block_writer: the actor of a decode instance that persists the KV blocks decode fills.
//
// Prefill persists a prompt's full blocks; the tokens a request generates fill more blocks,
// and a later turn of the conversation (or the same request rerouted after a failure) should
// hit them too. So every time a request's KV fills a 128-token block on a decode instance,
// the block is written to the store and recorded in the KV CHECK role. The engine must not
// wait for that, so it hands each step's filled blocks to this actor (one message per step)
// and goes on; the writer reserves the step's blocks (`kv_reserve`: no hits yet), then makes
// them visible (`kv_commit`) once written. The simulated world carries no KV bytes, so the
// write itself takes no time here: commit follows the reserve's answer. A store that fails or
// refuses room only costs future hits; the writer counts it and goes on.
//
// Keys of decode-generated blocks. Blocks are keyed by a hash chain (block_key.hpp) and a
// decode block continues the request's prompt chain. The simulated world has no token ids,
// so the content of sequence block i of request r is named by the content key
// `decode_content_key(r, i)` (XXH3-64 of r and i), and its key is
// `chain_hash(key of block i−1, decode_content_key(r, i), 128)`. The chain starts from the
// request's last prompt block key (`parent`, covering `parent_blocks` blocks; the zero key and
// 0 for a prompt shorter than a block). A block between the prompt's keyed blocks and the
// first decode block (a prompt whose trace gave fewer keys than full blocks) is chained the
// same way, so keys stay defined; it is not persisted by decode. Such keys only ever match a
// chain built with the same scheme (the same request extended, e.g. after a reroute): the
// sim's workload generators name later turns' content their own way.
#pragma once

#include "actors/kv/block_key.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/lb/prefill_balancer.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/store.hpp"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::actors {

/// The blocks one request's KV filled in one decode step, and where they sit in its chain.
struct filled_blocks {
  std::uint64_t request = 0;
  /// The request's last prompt block key (zero: none) and the blocks that key covers.
  block_key parent;
  std::uint64_t parent_blocks = 0;
  /// Index (from 0, over the whole sequence) of the first block filled, and how many.
  std::uint64_t first_block = 0;
  std::uint64_t count = 0;
  traffic_class traffic = traffic_class::chatbot;
  /// The request leaves the instance after this step (the writer forgets its chain tip).
  bool last = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, filled_blocks& x) {
  return f(caf::meta::type_name("filled_blocks"), x.request, x.parent, x.parent_blocks,
           x.first_block, x.count, x.traffic, x.last);
}

/// One decode step's filled blocks. No reply.
struct persist_blocks {
  std::vector<filled_blocks> filled;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, persist_blocks& x) {
  return f(caf::meta::type_name("persist_blocks"), x.filled);
}

/// Real world: full blocks whose bytes are at hand (a prefill's exported KV). `keys[i]` names
/// block `first + i` of `kv`. The writer reserves them in the CHECK role, writes the bytes of
/// every placed block the store does not hold yet (`store_put`, TTL of the traffic class) and
/// commits those that are in the store, so a block becomes a hit only once its bytes can be
/// read. No reply.
struct store_blocks {
  std::vector<block_key> keys;
  runtime::kv_snapshot_ptr kv;
  std::uint64_t first = 0;
  traffic_class traffic = traffic_class::chatbot;
};

/// Counters of one writer, in blocks.
struct block_writer_stats {
  instance_id instance = 0;
  /// Blocks handed to the writer.
  std::uint64_t blocks = 0;
  /// kv_reserve outcome: new (to write), already present, refused for lack of room.
  std::uint64_t reserved = 0;
  std::uint64_t refreshed = 0;
  std::uint64_t rejected = 0;
  /// kv_commit outcome: visible now, gone meanwhile.
  std::uint64_t committed = 0;
  std::uint64_t missing = 0;
  /// Blocks of a reserve or commit the store did not answer (an error).
  std::uint64_t failed = 0;
  /// Real world: blocks whose bytes were written, and writes the store refused.
  std::uint64_t written = 0;
  std::uint64_t write_failures = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, block_writer_stats& x) {
  return f(caf::meta::type_name("block_writer_stats"), x.instance, x.blocks, x.reserved,
           x.refreshed, x.rejected, x.committed, x.missing, x.failed, x.written,
           x.write_failures);
}

using block_writer_stats_atom = caf::atom_constant<caf::atom("bwstats")>;

using block_writer_actor
  = caf::typed_actor<caf::reacts_to<persist_blocks>, caf::reacts_to<store_blocks>,
                     caf::replies_to<block_writer_stats_atom>::with<block_writer_stats>>;

/// The content key of block `block_index` (from 0, over the whole sequence) of request
/// `request` when decode filled it (see the header comment).
std::uint64_t decode_content_key(std::uint64_t request, std::uint64_t block_index);

/// The keys of sequence blocks [first_block, first_block + count) of `request`, chained from
/// `parent` (the key of block parent_blocks − 1). Requires first_block ≥ parent_blocks.
std::vector<block_key> decode_chain(const block_key& parent, std::uint64_t parent_blocks,
                                    std::uint64_t request, std::uint64_t first_block,
                                    std::uint64_t count);

struct block_writer_params {
  instance_id instance = 0;
  /// The KV CHECK role. An invalid handle means: no writer (decode_instance spawns none).
  kv_check_actor kv;
  /// Called after each commit with the blocks it made visible (may be empty). Runs inside
  /// the writer; must not block.
  std::function<void(std::uint64_t)> on_persisted;
  /// Real world: the store the bytes of `store_blocks` go to (invalid: they are dropped), and
  /// the time to live of what it writes, by traffic class.
  runtime::store_port store;
  kv_ttls ttl;
};

/// Spawns a writer for `params.kv`. It answers nothing to persist_blocks; every step's blocks
/// go to the store as one kv_reserve then one kv_commit per traffic class. A store_blocks
/// message goes as one kv_reserve, a store_has then (when missing) a store_put per placed
/// block, and one kv_commit of the blocks the store holds.
block_writer_actor spawn_block_writer(caf::local_actor* parent, block_writer_params params);

} // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::store_blocks)

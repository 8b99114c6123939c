# KV block descriptors: the metadata of one persisted 128-token block of block KV, as the
# kv_store (CHECK role) indexes it and as fetchers and writers exchange it.
#
# Block i of a sequence is keyed by a hash chain, h_i = H(h_{i-1}, tokens of block i), so a
# prefix match walks descriptors only. Evolution: never renumber or retype a field, never reuse
# a number; only append fields (next free ordinal). Readers treat an absent field as its default.
@0xb24cb54fc7291ec3;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas::wire");

using Request = import "/schemas/request.capnp";

# The descriptor of one KV block; the payload itself lives in the store.
struct KvBlock {
  hash @0 :UInt64;            # chain hash of this block, H(parentHash, tokens); never 0
  parentHash @1 :UInt64;      # chain hash of the previous block; 0 for the first block
  tokenCount @2 :UInt16;      # tokens the block holds, 1..128 (only a chain's last block < 128)
  byteSize @3 :UInt64;        # payload size in bytes
  checksum @4 :UInt64;        # xxhash64 (seed 0) of the payload bytes, checked on every read
  trafficClass @5 :Request.TrafficClass;  # class of the request that wrote it; decides the TTL
  expiryNs @6 :UInt64;        # absolute expiry, ns since the Unix epoch; 0 means never
  modelTag @7 :UInt64;        # fingerprint of model, weights revision and KV layer set; blocks
                              # with different tags never match
}

# A run of blocks of one sequence, first block first; each block's parentHash is the previous
# block's hash.
struct KvBlockChain {
  blocks @0 :List(KvBlock);   # the blocks, in sequence order
}

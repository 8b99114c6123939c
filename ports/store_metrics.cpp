#include "ports/store_metrics.hpp"

#include <cstdint>

namespace troupe::ports {

store_metrics store_metrics::in(runtime::registry* reg, const std::string& shard) {
  std::vector<std::string> names;
  std::vector<std::string> values;
  if (!shard.empty()) {
    names.push_back("shard");
    values.push_back(shard);
  }
  auto gauge = [&](const char* name, const char* help) {
    return runtime::gauge_child(reg, name, help, names, values);
  };
  auto counter = [&](const char* name, const char* help, const char* outcome = nullptr) {
    if (outcome == nullptr)
      return runtime::counter_child(reg, name, help, names, values);
    auto n = names;
    auto v = values;
    n.insert(n.begin(), "outcome");
    v.insert(v.begin(), outcome);
    return runtime::counter_child(reg, name, help, std::move(n), v);
  };
  store_metrics m;
  m.objects = gauge("troupe_store_blocks", "KV blocks in the block store.");
  m.bytes = gauge("troupe_store_bytes", "Bytes the block store holds (headers included).");
  m.capacity = gauge("troupe_store_capacity_bytes", "The block store's capacity.");
  const char* reads = "Block reads by outcome (corrupt: failed the checksum, never served, "
                      "deleted).";
  m.hits = counter("troupe_store_reads_total", reads, "hit");
  m.misses = counter("troupe_store_reads_total", reads, "miss");
  m.corrupt = counter("troupe_store_reads_total", reads, "corrupt");
  m.evicted = counter("troupe_store_evictions_total",
                      "Blocks evicted to make room (least recently used first).");
  m.expired = counter("troupe_store_expirations_total", "Blocks removed when their TTL passed.");
  return m;
}

void store_metrics::publish(const runtime::store_stats& s) {
  auto advance = [](runtime::counter* c, std::uint64_t now, std::uint64_t before) {
    if (c != nullptr && now > before)
      c->inc(static_cast<double>(now - before));
  };
  if (objects != nullptr)
    objects->set(static_cast<double>(s.objects));
  if (bytes != nullptr)
    bytes->set(static_cast<double>(s.used));
  if (capacity != nullptr)
    capacity->set(static_cast<double>(s.capacity));
  advance(hits, s.hits, last.hits);
  advance(misses, s.misses, last.misses);
  advance(corrupt, s.corrupt, last.corrupt);
  advance(evicted, s.evicted, last.evicted);
  advance(expired, s.expired, last.expired);
  last = s;
}

} // namespace troupe::ports

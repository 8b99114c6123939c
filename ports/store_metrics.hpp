// store_metrics: a block store's figures as Prometheus metrics (troupe_store_*).
//
// The POSIX store publishes its stats after every answer. A process that reaches the cluster's
// store in another process (the control process of `troupe launch`, cluster/launch/
// store_bridge.hpp) publishes the stats it asks that store for, so the same metrics appear on
// its /metrics. Gauges take the stats' values; counters advance by the stats' growth, so they
// never go back, even when the store behind them restarts (call `restart` then: the new store
// counts from zero). A store of several shards (topology `storage.shards`) publishes each
// shard's figures under a `shard` label.
#pragma once

#include "runtime/metrics.hpp"
#include "runtime/ports/store.hpp"

#include <string>

namespace troupe::ports {

struct store_metrics {
  runtime::gauge* objects = nullptr;
  runtime::gauge* bytes = nullptr;
  runtime::gauge* capacity = nullptr;
  runtime::counter* hits = nullptr;
  runtime::counter* misses = nullptr;
  runtime::counter* corrupt = nullptr;
  runtime::counter* evicted = nullptr;
  runtime::counter* expired = nullptr;
  /// The stats published last.
  runtime::store_stats last;

  /// The store's metrics in `reg` (none: every pointer null, publishing changes nothing);
  /// with `shard` (not empty), those of that shard (label `shard`).
  static store_metrics in(runtime::registry* reg, const std::string& shard = {});

  /// Sets the gauges to `s` and advances the counters by its growth since `last`.
  void publish(const runtime::store_stats& s);

  /// The store behind the figures was replaced: its counters start again from zero.
  void restart() { last = {}; }
};

} // namespace troupe::ports

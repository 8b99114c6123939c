// The engines a real cluster's GPU ranks may run on besides the exact CPU one, by the name a
// topology's `device` gives them. The libraries are CPU-only; the troupe CLI, when built with
// the CUDA engine (cmake/cuda.cmake), registers "cuda" at startup (cluster/cuda_engine.cpp),
// and a program that embeds troupe may register its own.
#pragma once

#include "kernels/backend.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace troupe::cluster {

/// What a device of a served cluster asks of its engine.
struct device_limits {
  /// Sequences it runs in one step (a decode batch, or the prompts of a prefill step).
  std::int64_t max_sequences = 64;
  /// The longest context (prompt + output) of a sequence.
  std::int64_t max_context = 4096;
  /// Tokens of KV the device keeps in its memory for its sequences together (an engine with a
  /// pool of its own, as CUDA's pages); 0: as many as memory_fraction of its memory has room
  /// for.
  std::int64_t kv_tokens = 0;
  double memory_fraction = 0.9;
  /// The device's place in the cluster's order (a topology's prefill instances, then its
  /// decode instances): the engine spreads devices over the GPUs it sees by it (index mod
  /// their count), so the devices of one machine take GPUs of their own while there are
  /// enough, and a process that sees one GPU (a Slurm step, a Kubernetes pod) takes that one.
  std::uint32_t index = 0;
};

struct device_engine {
  /// Why this machine cannot run the engine ("no CUDA device: ..."); empty when it can.
  std::function<std::string()> unusable;
  /// The backend of one device (ports::cpu_device_params::backend), batch-invariant; called
  /// once per device spawned (a restarted device included).
  std::function<kernels::backend_opener(const device_limits&)> opener;
  /// The context a device allocates for when --max-context does not say; 0: the model's.
  std::uint64_t default_context = 0;
  /// Whether its backends roll back and draft (serve --spec).
  bool speculative = false;
};

/// Registers `engine` as the engine of device = `name` (replacing one of that name).
void add_device_engine(std::string name, device_engine engine);

/// Unregisters the engine of `name`, if any.
void remove_device_engine(std::string_view name);

/// The engine registered for `name`; null when none is.
const device_engine* find_device_engine(std::string_view name);

} // namespace troupe::cluster

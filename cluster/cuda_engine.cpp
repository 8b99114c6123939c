// The CUDA engine of device = "cuda" (cluster/device_engines.hpp), registered by the troupe CLI
// when it is built with troupe_cuda.
#include "cluster/cuda_engine.hpp"

#include "cluster/device_engines.hpp"
#include "cluster/device_leases.hpp"
#include "runtime/log.hpp"
#include "runtime/units.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"

namespace troupe::cluster {

void add_cuda_engine() {
  device_engine e;
  e.unusable = [] {
    auto gpu = kernels::cuda::query_device(0);
    return gpu ? std::string{} : gpu.error();
  };
  // Called where a device is spawned (an actor): the backend it returns runs on the device's
  // own thread, so the CUDA runtime is first touched there, GPU count included.
  e.opener = [](const device_limits& limits) -> kernels::backend_opener {
    kernels::cuda::cuda_backend_options o;
    o.max_sequences = limits.max_sequences;
    o.max_context = limits.max_context;
    o.kv_tokens = limits.kv_tokens;
    o.memory_fraction = limits.memory_fraction;
    o.batch_invariant = true;  // as the CPU devices of a served cluster are
    return [o, index = limits.index](kernels::model m) mutable
           -> kernels::result<std::unique_ptr<kernels::model_backend>> {
      // The instance's GPU by index, or the next one no other device of this host holds
      // (cluster/device_leases.hpp); the backend keeps the lease.
      if (auto gpus = kernels::cuda::device_count(); gpus && *gpus > 0) {
        std::vector<std::string> keys;
        for (int g = 0; g < *gpus; ++g) {
          auto id = kernels::cuda::pci_bus_id(g);
          keys.push_back(id ? *id : "cuda" + std::to_string(g));
        }
        auto leased = lease_device(keys, index % static_cast<std::uint32_t>(*gpus));
        o.device = static_cast<int>(leased.index);
        o.hold = leased.lease;
        if (!leased.lease)
          runtime::log::get("device")->warn(
            "every GPU of this host is held by another troupe device; sharing GPU {} ({})",
            leased.index, keys[leased.index]);
      }
      // The limits the device was given, in the flags that set them.
      const auto limits_text = fmt::format("--max-context {}, --gpu-memory-utilization {}, "
                                           "--kv-tokens {}", o.max_context, o.memory_fraction,
                                           o.kv_tokens);
      auto b = kernels::cuda::cuda_backend::open(std::move(m), o);
      if (!b)
        return kernels::result<std::unique_ptr<kernels::model_backend>>::failure(
          b.error() + " (" + limits_text + ")");
      const auto pool_bytes = (*b)->kv_tokens() / o.page_tokens * (*b)->page_bytes();
      runtime::log::get("device")->info("GPU {}: a KV page pool of {} tokens, {} ({})", o.device,
                                        (*b)->kv_tokens(),
                                        runtime::format_bytes(static_cast<std::uint64_t>(pool_bytes)),
                                        limits_text);
      return std::unique_ptr<kernels::model_backend>(std::move(*b));
    };
  };
  // The device's pool of compressed-KV pages holds every sequence at this context.
  e.default_context = 16384;
  e.speculative = true;  // rollback on the device, the DSpark layers on the host
  add_device_engine("cuda", std::move(e));
}

} // namespace troupe::cluster

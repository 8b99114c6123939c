// The CUDA device query (kernels/cuda/device.hpp).
#include "kernels/cuda/device.hpp"

#include <cuda_runtime.h>

namespace troupe::kernels::cuda {

std::string cuda_error_text(int error) {
  const auto e = static_cast<cudaError_t>(error);
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

result<int> device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return result<int>::failure("no CUDA device: " + cuda_error_text(e));
  if (n == 0) return result<int>::failure("no CUDA device: the driver lists none");
  return n;
}

result<std::string> pci_bus_id(int ordinal) {
  char id[32] = {};
  if (auto e = cudaDeviceGetPCIBusId(id, sizeof id, ordinal); e != cudaSuccess)
    return result<std::string>::failure("cudaDeviceGetPCIBusId: " + cuda_error_text(e));
  return std::string(id);
}

result<device_info> query_device(int ordinal) {
  using r = result<device_info>;
  auto n = device_count();
  if (!n) return r::failure(n.error());
  if (ordinal < 0 || ordinal >= *n)
    return r::failure("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                      std::to_string(*n) + " devices)");
  if (auto e = cudaSetDevice(ordinal); e != cudaSuccess)
    return r::failure("cudaSetDevice: " + cuda_error_text(e));
  cudaDeviceProp p{};
  if (auto e = cudaGetDeviceProperties(&p, ordinal); e != cudaSuccess)
    return r::failure("cudaGetDeviceProperties: " + cuda_error_text(e));
  device_info d;
  d.ordinal = ordinal;
  d.name = p.name;
  d.major = p.major;
  d.minor = p.minor;
  d.sms = p.multiProcessorCount;
  int clock_khz = 0, mem_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, ordinal);
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, ordinal);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal);
  d.sm_clock_hz = clock_khz * 1e3;
  d.hbm_bytes_per_s = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0);
  std::size_t free_b = 0, total_b = 0;
  if (auto e = cudaMemGetInfo(&free_b, &total_b); e != cudaSuccess)
    return r::failure("cudaMemGetInfo: " + cuda_error_text(e));
  d.free_bytes = static_cast<std::int64_t>(free_b);
  d.total_bytes = static_cast<std::int64_t>(total_b);
  const double per_sm_clock = d.major == 9 ? 4096 : d.major == 10 ? 8192 : 0;
  d.bf16_flops = per_sm_clock * d.sms * d.sm_clock_hz;
  // A driver that reports no clocks: the datasheet figures of the GPUs the engine targets.
  struct known { const char* name; double hbm, bf16; };
  for (const known& k : {known{"H100", 3.35e12, 989e12}, known{"H800", 3.35e12, 989e12},
                         known{"H200", 4.8e12, 989e12}, known{"B200", 8e12, 2250e12}})
    if (d.name.find(k.name) != std::string::npos) {
      if (d.hbm_bytes_per_s <= 0) d.hbm_bytes_per_s = k.hbm;
      if (d.bf16_flops <= 0) d.bf16_flops = k.bf16;
    }
  return d;
}

}  // namespace troupe::kernels::cuda

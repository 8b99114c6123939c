// The CUDA device this process runs on: what it is and what it can do at most.
//
// The GPU check (bench/gpu_check.sh) reports each kernel's throughput as a share of the
// device's limits, and the device-memory plan (kernels/device_layout.hpp) starts from the free
// memory; both come from here. HBM bandwidth is derived from the memory clock and bus width the
// driver reports (2 transfers per clock); dense BF16 tensor-core peak from the SM count, the SM
// clock and the per-SM rate of the architecture (4096 FLOP per clock on SM90, 8192 on SM100,
// NVIDIA's published figures divided out: H100/H200 SXM 989 TFLOP/s at 132 SMs and 1.83 GHz;
// B200 2.25 PFLOP/s at 148 SMs). They are estimates of the datasheet figures, not measurements;
// where the driver reports no clock, the datasheet figure of a known GPU (H100, H800, H200,
// B200) stands in.
// Every call returns failures as values (no device, no driver) and never throws.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

struct device_info {
  int ordinal = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int sms = 0;
  double sm_clock_hz = 0;
  std::int64_t total_bytes = 0;
  std::int64_t free_bytes = 0;
  double hbm_bytes_per_s = 0;  // peak, from the memory clock and bus width
  double bf16_flops = 0;       // dense tensor-core peak estimate; 0 for an architecture not listed
};

/// The number of CUDA devices; a failure naming the driver's error when there is no usable
/// device (no driver, no GPU).
result<int> device_count();

/// The PCI bus id of device `ordinal` ("0000:3B:00.0"), which names the GPU on its host
/// whatever CUDA_VISIBLE_DEVICES numbers it as; creates no context.
result<std::string> pci_bus_id(int ordinal);

/// Selects device `ordinal` for this thread and describes it.
result<device_info> query_device(int ordinal = 0);

/// The CUDA error name and text of a cudaError_t value (an int here, so that callers need not
/// include the CUDA headers).
std::string cuda_error_text(int error);

}  // namespace troupe::kernels::cuda

// The entry point of the device tests: without a usable CUDA device they do not run, and the
// executable exits 77 (ctest: skipped) after saying why; bench/gpu_check.sh refuses that case.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "kernels/cuda/device.hpp"

int main(int argc, char** argv) {
  auto dev = troupe::kernels::cuda::query_device(0);
  if (!dev) {
    std::printf("test_cuda: skipped, %s\n", dev.error().c_str());
    return 77;
  }
  std::printf("test_cuda: %s (sm_%d%d, %d SMs, %.0f GiB)\n", dev->name.c_str(), dev->major,
              dev->minor, dev->sms, static_cast<double>(dev->total_bytes) / (1 << 30));
  doctest::Context context(argc, argv);
  return context.run();
}

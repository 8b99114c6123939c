// The emulated device's memory (tests/cuda_host/emulated_device.cpp): host memory counted
// against a capacity the tests set, so that sizing from free memory and running out of it
// happen as on a GPU.
#pragma once

#include <cstdint>

namespace troupe::test {

/// The emulated device's total memory (4 GiB until set); allocations beyond it fail as
/// cudaMalloc's do. What is allocated stays allocated.
void set_emulated_memory(std::int64_t total_bytes);

/// Bytes allocated on the emulated device now.
std::int64_t emulated_memory_used();

}  // namespace troupe::test

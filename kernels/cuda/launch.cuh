// How kernels/cuda/*.cu launch their kernels and check the launch. Under nvcc: the `<<<>>>`
// launch on the caller's stream, then cudaGetLastError. Under the SIMT emulator
// (tests/cuda_host/simt.hpp, included first, which defines TROUPE_SIMT_EMULATOR): the launch
// runs on the calling thread, so the same launch code — grid sizes, shared memory, arguments —
// runs in the CPU tests, and the forward pass built on it (device_model.hpp) with them.
#pragma once

#include <string>

#include "kernels/result.hpp"

#ifdef TROUPE_SIMT_EMULATOR

#define TROUPE_LAUNCH(kernel, grid, block, shared, stream, ...) \
  ::troupe::test::simt::launch(dim3(grid), dim3(block), shared, kernel, __VA_ARGS__)

namespace troupe::kernels::cuda {
inline result<bool> launched(const char*) { return true; }
}  // namespace troupe::kernels::cuda

#else

#include <cuda_runtime.h>

#include "kernels/cuda/device.hpp"

#define TROUPE_LAUNCH(kernel, grid, block, shared, stream, ...) \
  kernel<<<grid, block, shared, static_cast<cudaStream_t>(stream)>>>(__VA_ARGS__)

namespace troupe::kernels::cuda {
// A failure naming `what` and the CUDA error when the launch itself failed.
inline result<bool> launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return result<bool>::failure(std::string(what) + ": " + cuda_error_text(e));
  return true;
}
}  // namespace troupe::kernels::cuda

#endif

// Device memory through the CUDA runtime (kernels/cuda/device_memory.hpp).
#include "kernels/cuda/device_memory.hpp"

#include <cuda_runtime.h>

#include "kernels/cuda/device.hpp"

namespace troupe::kernels::cuda {

namespace {

result<bool> checked(const char* what, cudaError_t e) {
  if (e != cudaSuccess) return result<bool>::failure(std::string(what) + ": " + cuda_error_text(e));
  return true;
}

}  // namespace

result<void*> device_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (auto c = checked("cudaMalloc", cudaMalloc(&p, bytes)); !c)
    return result<void*>::failure(c.error() + " of " + std::to_string(bytes) + " bytes");
  return p;
}

result<memory_info> device_memory() {
  std::size_t free_b = 0, total_b = 0;
  if (auto c = checked("cudaMemGetInfo", cudaMemGetInfo(&free_b, &total_b)); !c)
    return result<memory_info>::failure(c.error());
  return memory_info{static_cast<std::int64_t>(free_b), static_cast<std::int64_t>(total_b)};
}

void device_free(void* p) noexcept {
  if (p != nullptr) cudaFree(p);
}

result<bool> copy_to_device(void* dst, const void* src, std::size_t bytes) {
  return checked("cudaMemcpy to the device", cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

result<bool> copy_to_host(void* dst, const void* src, std::size_t bytes) {
  return checked("cudaMemcpy to the host", cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

result<bool> copy_on_device(void* dst, const void* src, std::size_t bytes) {
  return checked("cudaMemcpy on the device",
                 cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr));
}

result<bool> zero_device(void* p, std::size_t bytes) {
  return checked("cudaMemset", cudaMemsetAsync(p, 0, bytes, nullptr));
}

}  // namespace troupe::kernels::cuda

// Device memory for the CUDA engine's forward pass (device_model.hpp): allocation, copies and a
// typed owning array. troupe_cuda implements these with the CUDA runtime (device_memory.cpp);
// the CPU tests with host memory (tests/cuda_host/emulated_device.cpp), where the kernels run
// under the SIMT emulator, so the forward pass's own code runs in every test run. Copies to
// the host wait for the device's work queued before them (the default stream); the others are
// queued. Failures are values naming the CUDA error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

result<void*> device_alloc(std::size_t bytes);
void device_free(void* p) noexcept;
result<bool> copy_to_device(void* dst, const void* src, std::size_t bytes);
result<bool> copy_to_host(void* dst, const void* src, std::size_t bytes);
result<bool> copy_on_device(void* dst, const void* src, std::size_t bytes);
result<bool> zero_device(void* p, std::size_t bytes);

/// The current device's memory: what is free now and its total (cudaMemGetInfo).
struct memory_info {
  std::int64_t free_bytes = 0;
  std::int64_t total_bytes = 0;
};
result<memory_info> device_memory();

/// n elements of T in device memory, freed with the array.
template <class T>
class device_array {
 public:
  device_array() = default;
  device_array(device_array&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  device_array& operator=(device_array&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~device_array() { device_free(p_); }

  /// n zeroed elements.
  static result<device_array> zeros(std::size_t n) {
    device_array a;
    if (n == 0) return a;
    auto p = device_alloc(n * sizeof(T));
    if (!p) return result<device_array>::failure(p.error());
    a.p_ = static_cast<T*>(*p);
    a.n_ = n;
    if (auto z = zero_device(a.p_, n * sizeof(T)); !z) return result<device_array>::failure(z.error());
    return a;
  }
  /// A copy of `values`.
  static result<device_array> of(std::span<const T> values) {
    auto a = zeros(values.size());
    if (!a || values.empty()) return a;
    if (auto c = copy_to_device(a->p_, values.data(), values.size_bytes()); !c)
      return result<device_array>::failure(c.error());
    return a;
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t size() const { return n_; }

  /// values into the first values.size() elements.
  result<bool> upload(std::span<const T> values, std::size_t at = 0) {
    if (at + values.size() > n_)
      return result<bool>::failure("device_array: " + std::to_string(values.size()) +
                                   " values at " + std::to_string(at) + " past its " +
                                   std::to_string(n_));
    if (values.empty()) return true;
    return copy_to_device(p_ + at, values.data(), values.size_bytes());
  }
  /// The first n elements (all by default).
  result<std::vector<T>> download(std::size_t n = static_cast<std::size_t>(-1)) const {
    std::vector<T> out(std::min(n, n_));
    if (out.empty()) return out;
    if (auto c = copy_to_host(out.data(), p_, out.size() * sizeof(T)); !c)
      return result<std::vector<T>>::failure(c.error());
    return out;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace troupe::kernels::cuda

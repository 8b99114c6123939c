// A device array for the device tests: allocated, filled from and read back into host vectors.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

namespace troupe::test {

template <class T>
class device_buffer {
 public:
  explicit device_buffer(std::size_t n) : n_(n) {
    REQUIRE(cudaMalloc(&p_, sizeof(T) * (n == 0 ? 1 : n)) == cudaSuccess);
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) { upload(host); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(p_); }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    REQUIRE(cudaMemcpy(p_, host.data(), sizeof(T) * n_, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(host.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace troupe::test

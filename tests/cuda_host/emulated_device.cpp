// The device the CPU tests run the CUDA engine's host code on: the launch wrappers of
// kernels/cuda/*.cu built by the host compiler, their kernels running under the SIMT emulator
// (simt.hpp), device memory as host memory, and the FP32 GEMM as a plain loop (another order
// than the CPU engine's BLAS, and one that depends on the row count, as cuBLASLt's does).
// With these, kernels/cuda/device_model.cpp and cuda_backend.cpp — built here as they are for
// troupe_cuda — run the forward pass and the backend in every test run. What this device
// cannot show is a real one's: its math library, scheduling, memory model and cuBLASLt's
// kernels (bench/gpu_check.sh runs those).
#include "simt.hpp"  // first: the CUDA spellings, and TROUPE_LAUNCH on the emulator

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "emulated_device.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/moe_permute.cu"
#include "kernels/cuda/norm_attention.cu"
#include "kernels/cuda/portable_ops.cu"

namespace {

// The emulated memory: its capacity and each allocation's size (devices of several threads
// share it, as the devices of one GPU would).
struct emulated_memory {
  std::mutex mu;
  std::int64_t total = std::int64_t{1} << 32;
  std::int64_t used = 0;
  std::map<void*, std::int64_t> sizes;
};

emulated_memory& memory() {
  static emulated_memory m;
  return m;
}

}  // namespace

namespace troupe::test {

void set_emulated_memory(std::int64_t total_bytes) {
  std::lock_guard lock{memory().mu};
  memory().total = total_bytes;
}

std::int64_t emulated_memory_used() {
  std::lock_guard lock{memory().mu};
  return memory().used;
}

}  // namespace troupe::test

namespace troupe::kernels::cuda {

result<memory_info> device_memory() {
  auto& m = memory();
  std::lock_guard lock{m.mu};
  return memory_info{std::max<std::int64_t>(0, m.total - m.used), m.total};
}

result<device_info> query_device(int ordinal) {
  if (ordinal != 0) return result<device_info>::failure("no CUDA device: the emulator has one");
  device_info d;
  d.name = "emulated device (the SIMT emulator on the CPU)";
  d.major = 9;
  d.sms = 1;
  auto mem = device_memory();
  d.total_bytes = mem->total_bytes;
  d.free_bytes = mem->free_bytes;
  return d;
}

result<void*> device_alloc(std::size_t bytes) {
  auto& m = memory();
  std::lock_guard lock{m.mu};
  const auto n = static_cast<std::int64_t>(bytes);
  if (n > m.total - m.used)
    return result<void*>::failure("emulated device: out of memory: " + std::to_string(bytes) +
                                  " bytes asked, " + std::to_string(m.total - m.used) + " free");
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) return result<void*>::failure("emulated device: out of host memory");
  m.sizes[p] = n;
  m.used += n;
  return p;
}

void device_free(void* p) noexcept {
  if (p == nullptr) return;
  auto& m = memory();
  {
    std::lock_guard lock{m.mu};
    if (auto it = m.sizes.find(p); it != m.sizes.end()) {
      m.used -= it->second;
      m.sizes.erase(it);
    }
  }
  std::free(p);
}

result<bool> copy_to_device(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
  return true;
}

result<bool> copy_to_host(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
  return true;
}

result<bool> copy_on_device(void* dst, const void* src, std::size_t bytes) {
  std::memmove(dst, src, bytes);
  return true;
}

result<bool> zero_device(void* p, std::size_t bytes) {
  std::memset(p, 0, bytes);
  return true;
}

struct lt_gemm::state {};

lt_gemm::lt_gemm(std::unique_ptr<state> s) : s_(std::move(s)) {}
lt_gemm::lt_gemm(lt_gemm&&) noexcept = default;
lt_gemm& lt_gemm::operator=(lt_gemm&&) noexcept = default;
lt_gemm::~lt_gemm() = default;

result<lt_gemm> lt_gemm::create(std::int64_t) { return lt_gemm(std::make_unique<state>()); }

// Like cuBLASLt, whose algorithm (and so summation order) depends on the shape, the sum over k
// runs in slices whose length depends on m (4, 8 or 16), the slices' partial sums added after:
// a row's bits depend on how many rows share the call, which batch-invariant mode must avoid.
result<bool> lt_gemm::run_f32(const float* x, std::int64_t ldx, const float* w, std::int64_t ldw,
                              float* y, std::int64_t ldy, std::int64_t m, std::int64_t n,
                              std::int64_t k, void*) {
  const std::int64_t slice = std::int64_t{4} << (m % 3);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (std::int64_t p0 = 0; p0 < k; p0 += slice) {
        float part = 0.0f;
        for (std::int64_t p = p0; p < k && p < p0 + slice; ++p)
          part += x[i * ldx + p] * w[j * ldw + p];
        acc += part;
      }
      y[i * ldy + j] = acc;
    }
  return true;
}

}  // namespace troupe::kernels::cuda

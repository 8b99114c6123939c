// The dense GEMM of the CUDA engine through cuBLASLt: BF16 inputs (or FP32 ones, which the
// forward pass of device_model.hpp projects with today), FP32 accumulation and output.
//
// Every projection of the model is y[m, n] = x[m, k] · w[n, k]ᵀ (a torch Linear, row-major, as
// kernels/cpu_ops.hpp's `linear`). cuBLASLt computes it as the column-major product
// yᵀ = w · xᵀ ("TN", the layout Hopper's tensor cores prefer); a batch of equal-shaped products
// with strided operands serves the routed experts of one rank when every expert has the same
// number of rows (the benchmark's grouped GEMM). The handle, the workspace and the algorithm
// heuristic are the caller's to keep: make one `lt_gemm` per stream. Results are not
// batch-invariant: cuBLASLt may choose another algorithm (another summation order) for another
// m. Failures are values naming the cuBLASLt status.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

class lt_gemm {
 public:
  /// A cuBLASLt handle with `workspace_bytes` of device workspace.
  static result<lt_gemm> create(std::int64_t workspace_bytes = std::int64_t{32} << 20);

  lt_gemm(lt_gemm&&) noexcept;
  lt_gemm& operator=(lt_gemm&&) noexcept;
  ~lt_gemm();

  /// y[b][m, n] = x[b][m, k] · w[b][n, k]ᵀ for b < batch, x and w BF16 (raw 16-bit words), y
  /// FP32, consecutive batches `m·k`, `n·k` and `m·n` elements apart, on `stream`. Errors: a
  /// non-positive size, no algorithm for the shape, a cuBLASLt failure.
  result<bool> run(const std::uint16_t* x, const std::uint16_t* w, float* y, std::int64_t m,
                   std::int64_t n, std::int64_t k, std::int64_t batch = 1,
                   void* stream = nullptr);

  /// y[m, n] (row stride ldy) = x[m, k] (row stride ldx) · w[n, k]ᵀ (row stride ldw), all
  /// FP32 (cuBLASLt's FP32 compute: no tensor-core down-conversion). m = 0 does nothing.
  result<bool> run_f32(const float* x, std::int64_t ldx, const float* w, std::int64_t ldw,
                       float* y, std::int64_t ldy, std::int64_t m, std::int64_t n, std::int64_t k,
                       void* stream = nullptr);

  struct state;  // the handle and the workspace (gemm.cpp)

 private:
  explicit lt_gemm(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

/// x rounded to the nearest BF16 (ties to even), as its 16-bit word; and back.
std::uint16_t to_bf16(float x);
float from_bf16(std::uint16_t b);

}  // namespace troupe::kernels::cuda

// The cuBLASLt BF16 GEMM (kernels/cuda/gemm.hpp).
#include "kernels/cuda/gemm.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace troupe::kernels::cuda {

struct lt_gemm::state {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::int64_t workspace_bytes = 0;
  ~state() {
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

namespace {

std::string status(const char* what, cublasStatus_t s) {
  return std::string(what) + ": " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")";
}

// The layouts and descriptors of one call, destroyed together.
struct call {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~call() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two up to 256 dividing the address: cuBLASLt's heuristic assumes 256-byte
// aligned operands unless told otherwise, and an algorithm it picks under that assumption may
// fail on a pointer into the middle of a buffer (one expert's rows).
std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t b = 256;
  while (b > 1 && a % b != 0) b /= 2;
  return b;
}

cublasStatus_t batched(cublasLtMatrixLayout_t l, std::int64_t batch, std::int64_t stride) {
  const auto count = static_cast<int>(batch);
  auto s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                            sizeof count);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                          sizeof stride);
}

}  // namespace

lt_gemm::lt_gemm(std::unique_ptr<state> s) : s_(std::move(s)) {}
lt_gemm::lt_gemm(lt_gemm&&) noexcept = default;
lt_gemm& lt_gemm::operator=(lt_gemm&&) noexcept = default;
lt_gemm::~lt_gemm() = default;

result<lt_gemm> lt_gemm::create(std::int64_t workspace_bytes) {
  using r = result<lt_gemm>;
  auto s = std::make_unique<state>();
  if (auto st = cublasLtCreate(&s->handle); st != CUBLAS_STATUS_SUCCESS)
    return r::failure(status("cublasLtCreate", st));
  if (workspace_bytes > 0) {
    if (auto e = cudaMalloc(&s->workspace, static_cast<std::size_t>(workspace_bytes));
        e != cudaSuccess)
      return r::failure(std::string("gemm workspace: ") + cudaGetErrorString(e));
    s->workspace_bytes = workspace_bytes;
  }
  return lt_gemm(std::move(s));
}

namespace {

// y = x · wᵀ in cuBLASLt's column-major terms: A = w as [k, n] (ld ldw, transposed by the op),
// B = x as [k, m] (ld ldx), C = y as [n, m] (ld ldy), elements of `in` type, y FP32; `batch`
// products with consecutive operands n·k, m·k and m·n elements apart.
result<bool> matmul(lt_gemm::state& state, const char* what, cudaDataType_t in, const void* x,
                    std::int64_t ldx, const void* w, std::int64_t ldw, float* y, std::int64_t ldy,
                    std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                    void* stream) {
  using r = result<bool>;
  call c;
  cublasStatus_t st = cublasLtMatmulDescCreate(&c.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return r::failure(status("cublasLtMatmulDescCreate", st));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa);
  cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb);
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  if ((st = cublasLtMatrixLayoutCreate(&c.a, in, u(k), u(n), ldw)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatrixLayoutCreate(&c.b, in, u(k), u(m), ldx)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasLtMatrixLayoutCreate(&c.c, CUDA_R_32F, u(n), u(m), ldy)) != CUBLAS_STATUS_SUCCESS)
    return r::failure(status("cublasLtMatrixLayoutCreate", st));
  if (batch > 1 &&
      ((st = batched(c.a, batch, n * k)) != CUBLAS_STATUS_SUCCESS ||
       (st = batched(c.b, batch, m * k)) != CUBLAS_STATUS_SUCCESS ||
       (st = batched(c.c, batch, m * n)) != CUBLAS_STATUS_SUCCESS))
    return r::failure(status("batched layout", st));
  if ((st = cublasLtMatmulPreferenceCreate(&c.pref)) != CUBLAS_STATUS_SUCCESS)
    return r::failure(status("cublasLtMatmulPreferenceCreate", st));
  const auto ws = static_cast<std::uint64_t>(state.workspace_bytes);
  cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  const std::uint32_t align_a = alignment(w), align_b = alignment(x), align_c = alignment(y);
  cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof align_a);
  cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof align_b);
  cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof align_c);
  cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                       sizeof align_c);
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(state.handle, c.op, c.a, c.b, c.c, c.c, c.pref, 1,
                                      &heuristic, &found);
  if (st != CUBLAS_STATUS_SUCCESS) return r::failure(status("cublasLtMatmulAlgoGetHeuristic", st));
  if (found == 0)
    return r::failure(std::string(what) + ": cuBLASLt has no algorithm for m " +
                      std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k));
  const float alpha = 1.0f, beta = 0.0f;
  st = cublasLtMatmul(state.handle, c.op, &alpha, w, c.a, x, c.b, &beta, y, c.c, y, c.c,
                      &heuristic.algo, state.workspace,
                      static_cast<std::size_t>(state.workspace_bytes),
                      static_cast<cudaStream_t>(stream));
  if (st != CUBLAS_STATUS_SUCCESS) return r::failure(status("cublasLtMatmul", st));
  return true;
}

}  // namespace

result<bool> lt_gemm::run(const std::uint16_t* x, const std::uint16_t* w, float* y,
                            std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                            void* stream) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0)
    return result<bool>::failure("lt_gemm: sizes m " + std::to_string(m) + ", n " +
                                 std::to_string(n) + ", k " + std::to_string(k) + ", batch " +
                                 std::to_string(batch));
  return matmul(*s_, "lt_gemm", CUDA_R_16BF, x, k, w, k, y, n, m, n, k, batch, stream);
}

result<bool> lt_gemm::run_f32(const float* x, std::int64_t ldx, const float* w, std::int64_t ldw,
                              float* y, std::int64_t ldy, std::int64_t m, std::int64_t n,
                              std::int64_t k, void* stream) {
  if (m == 0) return true;
  if (m < 0 || n <= 0 || k <= 0 || ldx < k || ldw < k || ldy < n)
    return result<bool>::failure("lt_gemm f32: sizes m " + std::to_string(m) + ", n " +
                                 std::to_string(n) + ", k " + std::to_string(k) +
                                 " with row strides " + std::to_string(ldx) + ", " +
                                 std::to_string(ldw) + ", " + std::to_string(ldy));
  return matmul(*s_, "lt_gemm f32", CUDA_R_32F, x, ldx, w, ldw, y, ldy, m, n, k, 1, stream);
}

std::uint16_t to_bf16(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<std::uint16_t>((bits >> 16) | 0x40);  // a quiet NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

float from_bf16(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float x = 0;
  std::memcpy(&x, &bits, 4);
  return x;
}

}  // namespace troupe::kernels::cuda

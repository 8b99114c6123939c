// The CUDA engine's kernels against the device's own limits: sliding-window decode attention as
// a share of peak HBM bandwidth (bytes it must read: every sequence's window rows once, its
// queries and outputs), and the routed experts' GEMM (one rank's experts at EP 8, equal rows per
// expert, BF16 batched through cuBLASLt) as a share of peak dense BF16 tensor-core FLOP/s. The
// peaks come from kernels/cuda/device.hpp (clock × bus width; SM count × clock × per-SM rate).
// Also the indexer's top-k (radix select) against one read of its scores at peak HBM bandwidth,
// and batch-invariant mode's tiled FP32 projection against the CUDA cores' unfused FP32 peak.
// Prints a table; goals: attention >= 70 % of HBM, expert GEMM >= 60 % of peak. Exit status 0
// when the four kernels ran (met or not: the table says), 1 on any failure, 2 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/ops.hpp"

using namespace troupe::kernels::cuda;

namespace {

template <class T>
T* device_array(std::size_t n, float lo = -1, float hi = 1) {
  std::vector<T> host(n);
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(lo, hi);
  for (auto& v : host) {
    if constexpr (std::is_same_v<T, std::uint16_t>)
      v = to_bf16(u(g));
    else
      v = static_cast<T>(u(g));
  }
  T* p = nullptr;
  if (cudaMalloc(&p, sizeof(T) * n) != cudaSuccess) return nullptr;
  cudaMemcpy(p, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice);
  return p;
}

// Seconds per call of `fn`, the median of `rounds` rounds of `iters` calls after a warm-up.
template <class F>
double time_calls(F&& fn, int iters = 20, int rounds = 5) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> s;
  for (int r = 0; r < rounds; ++r) {
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    s.push_back(ms / 1e3 / iters);
  }
  std::sort(s.begin(), s.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return s[s.size() / 2];
}

}  // namespace

int main() {
  auto dev = query_device(0);
  if (!dev) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", dev.error().c_str());
    return 2;
  }
  std::printf("device: %s, sm_%d%d, %d SMs, HBM peak %.2f TB/s, BF16 dense peak %.0f TFLOP/s (estimates)\n",
              dev->name.c_str(), dev->major, dev->minor, dev->sms, dev->hbm_bytes_per_s / 1e12,
              dev->bf16_flops / 1e12);
  bool failed = false;

  // Decode attention: 256 sequences, the released sliding-window layer shape.
  const std::int64_t B = 256, H = 64, hd = 512, win = 128, cap = win + 6, rope = 64;
  float* q = device_array<float>(static_cast<std::size_t>(B * H * hd), -0.2f, 0.2f);
  float* rings = device_array<float>(static_cast<std::size_t>(B * cap * hd));
  float* sinks = device_array<float>(static_cast<std::size_t>(H));
  float* freq = device_array<float>(static_cast<std::size_t>(rope / 2), 0, 1);
  float* out = device_array<float>(static_cast<std::size_t>(B * H * hd));
  std::vector<std::int64_t> pos(static_cast<std::size_t>(B), 4000), begin(static_cast<std::size_t>(B), 4000 - cap + 1);
  std::int64_t *dpos = nullptr, *dbegin = nullptr;
  cudaMalloc(&dpos, sizeof(std::int64_t) * B);
  cudaMalloc(&dbegin, sizeof(std::int64_t) * B);
  cudaMemcpy(dpos, pos.data(), sizeof(std::int64_t) * B, cudaMemcpyHostToDevice);
  cudaMemcpy(dbegin, begin.data(), sizeof(std::int64_t) * B, cudaMemcpyHostToDevice);
  swa_decode_args a{q, rings, dpos, dbegin, sinks, freq, out, B, H, hd, cap, win, rope, 0.0442f, 1.0f};
  bool ok = swa_decode_attention(a).ok() && cudaDeviceSynchronize() == cudaSuccess;
  double attn_s = ok ? time_calls([&] { (void)swa_decode_attention(a); }) : 0;
  ok = ok && cudaGetLastError() == cudaSuccess;
  const double attn_bytes = 4.0 * (B * win * hd + 2.0 * B * H * hd);
  const double attn_share = ok ? attn_bytes / attn_s / dev->hbm_bytes_per_s : 0;
  failed |= !ok;

  // Expert GEMM: 48 local experts (384 at EP 8), 256 rows each, w1 and w3 fused (2 x 2304) by
  // the hidden size 5120.
  const std::int64_t experts = 48, m = 256, n = 2 * 2304, k = 5120;
  auto* x = device_array<std::uint16_t>(static_cast<std::size_t>(experts * m * k));
  auto* w = device_array<std::uint16_t>(static_cast<std::size_t>(experts * n * k), -0.05f, 0.05f);
  float* y = nullptr;
  cudaMalloc(&y, sizeof(float) * static_cast<std::size_t>(experts * m * n));
  auto gemm = lt_gemm::create();
  double gemm_s = 0;
  if (gemm && x && w && y) {
    auto first = gemm->run(x, w, y, m, n, k, experts);
    if (first) gemm_s = time_calls([&] { (void)gemm->run(x, w, y, m, n, k, experts); }, 5, 5);
    else std::fprintf(stderr, "gemm: %s\n", first.error().c_str());
  }
  const bool gemm_ok = gemm_s > 0 && cudaGetLastError() == cudaSuccess;
  failed |= !gemm_ok;
  const double flops = 2.0 * experts * m * n * k;
  const double gemm_share = gemm_ok && dev->bf16_flops > 0 ? flops / gemm_s / dev->bf16_flops : 0;

  // The indexer's top-k: 256 queries each choosing 512 of 16,384 compressed entries (a 64K
  // context at ratio 4) by the radix select; its floor is reading the scores once at peak HBM
  // bandwidth (it reads them five times, from L2 after the first where they fit).
  const std::int64_t rows = 256, entries = 16384, top = 512;
  float* index_scores = device_array<float>(static_cast<std::size_t>(rows * entries), -10, 10);
  std::int64_t *top_idx = nullptr, *top_count = nullptr;
  cudaMalloc(&top_idx, sizeof(std::int64_t) * rows * top);
  cudaMalloc(&top_count, sizeof(std::int64_t) * rows);
  auto select = [&] { return top_k_rows(index_scores, rows, entries, top, nullptr, top_idx, top_count); };
  bool top_ok = index_scores != nullptr && select().ok() && cudaDeviceSynchronize() == cudaSuccess;
  const double top_s = top_ok ? time_calls([&] { (void)select(); }) : 0;
  top_ok = top_ok && cudaGetLastError() == cudaSuccess;
  const double top_bytes = 4.0 * rows * entries;
  failed |= !top_ok;

  // Batch-invariant mode's projection (project_rows): 256 tokens through a 4096 x 4096 FP32
  // weight, against the CUDA cores' FP32 peak without fused multiply-adds (128 lanes per SM,
  // a multiply and an add per product: SMs x clock x 128 FLOP/s).
  const std::int64_t pm = 256, pn = 4096, pk = 4096;
  float* px = device_array<float>(static_cast<std::size_t>(pm * pk));
  float* pw = device_array<float>(static_cast<std::size_t>(pn * pk), -0.05f, 0.05f);
  float* py = nullptr;
  cudaMalloc(&py, sizeof(float) * static_cast<std::size_t>(pm * pn));
  auto project = [&] { return project_rows(px, pk, pw, pk, py, pn, pm, pn, pk); };
  bool proj_ok = px != nullptr && pw != nullptr && py != nullptr && project().ok() &&
                 cudaDeviceSynchronize() == cudaSuccess;
  const double proj_s = proj_ok ? time_calls([&] { (void)project(); }, 5, 5) : 0;
  proj_ok = proj_ok && cudaGetLastError() == cudaSuccess;
  const double proj_flops = 2.0 * pm * pn * pk;
  const double fp32_peak = dev->sms * dev->sm_clock_hz * 128;
  failed |= !proj_ok;

  std::printf("\n| kernel | shape | time | achieved | share of peak | goal | met |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| SWA decode attention | %lld seqs x %lld heads x %lld, window %lld | %.1f us | %.2f TB/s | %.1f %% of HBM | >= 70 %% | %s |\n",
              (long long)B, (long long)H, (long long)hd, (long long)win, attn_s * 1e6,
              ok ? attn_bytes / attn_s / 1e12 : 0.0, 100 * attn_share, ok ? (attn_share >= 0.7 ? "yes" : "no") : "FAILED");
  std::printf("| expert GEMM (BF16, cuBLASLt batched) | %lld experts x %lld x %lld x %lld | %.1f us | %.0f TFLOP/s | %.1f %% of BF16 | >= 60 %% | %s |\n",
              (long long)experts, (long long)m, (long long)n, (long long)k, gemm_s * 1e6,
              gemm_ok ? flops / gemm_s / 1e12 : 0.0, 100 * gemm_share,
              gemm_ok ? (gemm_share >= 0.6 ? "yes" : "no") : "FAILED");
  std::printf("| indexer top-k (radix select) | %lld rows x %lld entries, k %lld | %.1f us | %.2f TB/s | %.1f %% of HBM | none set | %s |\n",
              (long long)rows, (long long)entries, (long long)top, top_s * 1e6,
              top_ok ? top_bytes / top_s / 1e12 : 0.0,
              top_ok ? 100 * top_bytes / top_s / dev->hbm_bytes_per_s : 0.0, top_ok ? "-" : "FAILED");
  std::printf("| batch-invariant projection (project_rows, FP32) | %lld x %lld x %lld | %.1f us | %.1f TFLOP/s | %.1f %% of unfused FP32 | none set | %s |\n",
              (long long)pm, (long long)pn, (long long)pk, proj_s * 1e6,
              proj_ok ? proj_flops / proj_s / 1e12 : 0.0,
              proj_ok && fp32_peak > 0 ? 100 * proj_flops / proj_s / fp32_peak : 0.0,
              proj_ok ? "-" : "FAILED");
  return failed ? 1 : 0;
}

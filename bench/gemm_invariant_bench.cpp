// The batch-invariant GEMM (kernels::gemm_nt_invariant) beside OpenBLAS on the LM head of the
// small preset (129,280 × 256, fp32): one GEMV per row (what batch invariance cost before),
// our kernel, and one OpenBLAS GEMM (the fastest, not batch-invariant), for 1, 4 and 16 rows.
// Single-threaded; CPU time of the calling thread (less sensitive to other load than wall
// time), min and median of --rounds interleaved rounds. Prints the load average beside it.
//
//   build/bench/bench_gemm_invariant [--rounds N]
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "kernels/cpu_ops.hpp"

namespace {

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  troupe::kernels::reexec_with_blas_kernel_upgrade(argv);  // the kernel troupe runs with
  int rounds = 7;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--rounds") == 0)
      rounds = std::max(1, std::atoi(argv[i + 1]));
  using troupe::kernels::gemm_nt_invariant;
  troupe::kernels::set_blas_threads(1);
  const long out = 129280, in = 256, max_rows = 16;
  std::vector<float> w(static_cast<std::size_t>(out * in)), x(static_cast<std::size_t>(max_rows * in)),
    y(static_cast<std::size_t>(max_rows * out));
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = static_cast<float>(i % 97) * 0.01f - 0.4f;
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(i % 13) * 0.1f - 0.5f;
  double load[3] = {};
  getloadavg(load, 3);
  std::printf("LM head %ld x %ld fp32, 1 thread, OpenBLAS kernel %s, %d rounds; load average %.2f\n",
              out, in, troupe::kernels::blas_kernel_name().c_str(), rounds, load[0]);
  std::printf("rows  per-row GEMV ms (min/median)  invariant ms (min/median)  BLAS GEMM ms (min/median)\n");
  for (long rows : {1L, 4L, 16L}) {
    std::vector<double> gemv, inv, gemm;
    for (int r = 0; r < rounds; ++r) {
      double t0 = thread_cpu_s();
      for (long i = 0; i < rows; ++i)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(out), static_cast<blasint>(in),
                    1.0f, w.data(), static_cast<blasint>(in), x.data() + i * in, 1, 0.0f,
                    y.data() + i * out, 1);
      double t1 = thread_cpu_s();
      gemm_nt_invariant(x.data(), rows, in, in, w.data(), 0, out, y.data(), out);
      double t2 = thread_cpu_s();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows),
                  static_cast<blasint>(out), static_cast<blasint>(in), 1.0f, x.data(),
                  static_cast<blasint>(in), w.data(), static_cast<blasint>(in), 0.0f, y.data(),
                  static_cast<blasint>(out));
      double t3 = thread_cpu_s();
      gemv.push_back((t1 - t0) * 1e3);
      inv.push_back((t2 - t1) * 1e3);
      gemm.push_back((t3 - t2) * 1e3);
    }
    std::printf("%4ld  %12.2f / %-12.2f  %12.2f / %-12.2f  %11.2f / %-11.2f\n", rows,
                *std::min_element(gemv.begin(), gemv.end()), median(gemv),
                *std::min_element(inv.begin(), inv.end()), median(inv),
                *std::min_element(gemm.begin(), gemm.end()), median(gemm));
  }
  getloadavg(load, 3);
  std::printf("load average after: %.2f\n", load[0]);
}

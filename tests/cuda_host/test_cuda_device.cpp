// The device port (ports/cpu_device.hpp) running cuda_backend on the emulated device, as a CUDA
// GPU rank of `troupe serve` runs it: the same messages as a CPU device, the same tokens, and
// KV that moves between CPU and CUDA devices by kv_export / kv_import.
#include "kernels/cuda/cuda_backend.hpp"
#include "tests/ports/device_fixture.hpp"

using namespace troupe;
using namespace troupe::test;
using runtime::device_errc;

namespace {

ports::cpu_device_params cuda_params(kernels::cuda::cuda_backend_options options = {}) {
  auto p = tiny_params();
  p.backend = kernels::cuda::cuda_backend::opener(options);
  return p;
}

// Each token's logprob on one device within rounding of the other's.
void check_close(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(std::fabs(a[i] - b[i]) < 1e-4);
}

} // namespace

TEST_CASE_FIXTURE(device_fixture, "emulated device: a device port on cuda_backend decodes the CPU "
                                  "device's greedy tokens") {
  auto gpu = cpu(cuda_params());
  auto host = cpu(tiny_params());
  const auto pr = prompt(23, 1);
  std::vector<float> lp_gpu, lp_host;
  const auto on_gpu = greedy(gpu, 1, pr, 8, &lp_gpu);
  CHECK(on_gpu == greedy(host, 1, pr, 8, &lp_host));
  check_close(lp_gpu, lp_host);
  // Two sequences in one step, beside each other's prefill.
  const auto other = prompt(11, 2);
  auto r = run(gpu, step({seq(1, pr.size() + 7, {on_gpu.back()}), seq(2, 0, other)}, 2));
  auto w = run(host, step({seq(1, pr.size() + 7, {on_gpu.back()}), seq(2, 0, other)}, 2));
  REQUIRE_MESSAGE(r, sys.render(r.error()));
  REQUIRE(w);
  REQUIRE(r->sampled.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(r->sampled[i].sequence == w->sampled[i].sequence);
    CHECK(r->sampled[i].token == w->sampled[i].token);
  }
}

TEST_CASE_FIXTURE(device_fixture, "emulated device: KV moves from a CPU device to a CUDA device "
                                  "and back by kv_export / kv_import") {
  auto host = cpu(tiny_params());
  auto gpu = cpu(cuda_params());
  const auto pr = prompt(140, 8);  // one full 128-token block and a partial one
  const auto first = greedy(host, 1, pr, 2);
  auto snap = ask<runtime::kv_snapshot_ptr>(host, runtime::kv_export{1});
  REQUIRE_MESSAGE(snap, sys.render(snap.error()));
  CHECK((*snap)->blocks.size() == 1);
  auto ok = ask<caf::ok_atom>(gpu, runtime::kv_import{5, *snap});
  REQUIRE_MESSAGE(ok, sys.render(ok.error()));
  std::vector<float> lp_gpu, lp_host;
  const auto on_gpu = continue_greedy(gpu, 5, 141, first.back(), 4, &lp_gpu);
  CHECK(on_gpu == continue_greedy(host, 1, 141, first.back(), 4, &lp_host));
  check_close(lp_gpu, lp_host);

  // Back to a second CPU device, from the CUDA device's cache.
  auto back = ask<runtime::kv_snapshot_ptr>(gpu, runtime::kv_export{5});
  REQUIRE_MESSAGE(back, sys.render(back.error()));
  CHECK((*back)->length == 145);
  auto host2 = cpu(tiny_params());
  REQUIRE(ask<caf::ok_atom>(host2, runtime::kv_import{9, *back}));
  lp_gpu.clear();
  lp_host.clear();
  const auto after = continue_greedy(host2, 9, 145, on_gpu.back(), 3, &lp_host);
  CHECK(after == continue_greedy(gpu, 5, 145, on_gpu.back(), 3, &lp_gpu));
  check_close(lp_gpu, lp_host);
}

TEST_CASE_FIXTURE(device_fixture, "emulated device: what a device port on cuda_backend refuses") {
  SUBCASE("expert-parallel load balancing: a load error that says so") {
    auto p = cuda_params();
    p.experts = std::make_shared<ports::expert_link>(16);
    auto dev = cpu(std::move(p));
    auto r = run(dev, step({seq(1, 0, {3, 4})}));
    REQUIRE_FALSE(r);
    CHECK(runtime::is(r.error(), device_errc::load_failed));
    CHECK(sys.render(r.error()).find("runs on the CPU backend only") != std::string::npos);
  }
  SUBCASE("a batch larger than the device holds: compute_failed, and the sequences go on") {
    kernels::cuda::cuda_backend_options o;
    o.max_sequences = 1;
    auto dev = cpu(cuda_params(o));
    auto r = run(dev, step({seq(1, 0, {3, 4}), seq(2, 0, {5})}));
    REQUIRE_FALSE(r);
    CHECK(runtime::is(r.error(), device_errc::compute_failed));
    CHECK(sys.render(r.error()).find("the device holds 1 at once") != std::string::npos);
    CHECK(run(dev, step({seq(1, 0, {3, 4})})));
  }
}

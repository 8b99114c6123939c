// The device port (ports/cpu_device.hpp) running cuda_backend, as a CUDA GPU rank of
// `troupe serve` runs it: the same messages as a CPU device, the same tokens, and KV that moves
// between CPU and CUDA devices by kv_export / kv_import. Run on the emulated device
// (tests/cuda_host/test_cuda_device.cpp) and on a GPU (tests/cuda/test_device_port.cpp).
#pragma once

#include "kernels/cuda/cuda_backend.hpp"
#include "tests/ports/device_fixture.hpp"

#include <cmath>
#include <numeric>

namespace troupe::test {

inline ports::cpu_device_params cuda_params(kernels::cuda::cuda_backend_options options = {}) {
  auto p = tiny_params();
  p.backend = kernels::cuda::cuda_backend::opener(options);
  return p;
}

/// Each token's logprob on one device within rounding of the other's.
inline void check_close(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(std::fabs(a[i] - b[i]) < 1e-4);
}

/// Greedy decoding on a CUDA device gives a CPU device's tokens, alone and two in a step.
inline void check_greedy_as_cpu(device_fixture& f) {
  auto gpu = f.cpu(cuda_params());
  auto host = f.cpu(tiny_params());
  const auto pr = prompt(23, 1);
  std::vector<float> lp_gpu, lp_host;
  const auto on_gpu = f.greedy(gpu, 1, pr, 8, &lp_gpu);
  CHECK(on_gpu == f.greedy(host, 1, pr, 8, &lp_host));
  check_close(lp_gpu, lp_host);
  // Two sequences in one step, beside each other's prefill.
  const auto other = prompt(11, 2);
  auto r = f.run(gpu, step({seq(1, pr.size() + 7, {on_gpu.back()}), seq(2, 0, other)}, 2));
  auto w = f.run(host, step({seq(1, pr.size() + 7, {on_gpu.back()}), seq(2, 0, other)}, 2));
  REQUIRE_MESSAGE(r, f.sys.render(r.error()));
  REQUIRE(w);
  REQUIRE(r->sampled.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(r->sampled[i].sequence == w->sampled[i].sequence);
    CHECK(r->sampled[i].token == w->sampled[i].token);
  }
}

/// A sequence prefilled on a CPU device continues on a CUDA device, and from there on a
/// second CPU device, with the same tokens.
inline void check_kv_both_ways(device_fixture& f) {
  auto host = f.cpu(tiny_params());
  auto gpu = f.cpu(cuda_params());
  const auto pr = prompt(140, 8);  // one full 128-token block and a partial one
  const auto first = f.greedy(host, 1, pr, 2);
  auto snap = f.ask<runtime::kv_snapshot_ptr>(host, runtime::kv_export{1});
  REQUIRE_MESSAGE(snap, f.sys.render(snap.error()));
  CHECK((*snap)->blocks.size() == 1);
  auto ok = f.ask<caf::ok_atom>(gpu, runtime::kv_import{5, *snap});
  REQUIRE_MESSAGE(ok, f.sys.render(ok.error()));
  std::vector<float> lp_gpu, lp_host;
  const auto on_gpu = f.continue_greedy(gpu, 5, 141, first.back(), 4, &lp_gpu);
  CHECK(on_gpu == f.continue_greedy(host, 1, 141, first.back(), 4, &lp_host));
  check_close(lp_gpu, lp_host);

  auto back = f.ask<runtime::kv_snapshot_ptr>(gpu, runtime::kv_export{5});
  REQUIRE_MESSAGE(back, f.sys.render(back.error()));
  CHECK((*back)->length == 145);
  auto host2 = f.cpu(tiny_params());
  REQUIRE(f.ask<caf::ok_atom>(host2, runtime::kv_import{9, *back}));
  lp_gpu.clear();
  lp_host.clear();
  const auto after = f.continue_greedy(host2, 9, 145, on_gpu.back(), 3, &lp_host);
  CHECK(after == f.continue_greedy(gpu, 5, 145, on_gpu.back(), 3, &lp_gpu));
  check_close(lp_gpu, lp_host);
}

/// What a CUDA device refuses: a batch larger than the device holds (compute_failed, and its
/// sequences go on); sequences beyond what it holds wait in host memory, counted in
/// troupe_device_evictions_total.
inline void check_refusals(device_fixture& f) {
  using runtime::device_errc;
  {
    kernels::cuda::cuda_backend_options o;
    o.max_sequences = 1;
    runtime::registry metrics;
    auto p = cuda_params(o);
    p.metrics = &metrics;
    p.name = "gpu";
    auto dev = f.cpu(std::move(p));
    auto r = f.run(dev, step({seq(1, 0, {3, 4}), seq(2, 0, {5})}));
    REQUIRE_FALSE(r);
    CHECK(runtime::is(r.error(), device_errc::compute_failed));
    CHECK(f.sys.render(r.error()).find("the device holds 1 at once") != std::string::npos);
    // One at a time they run, each step moving the other to the host.
    CHECK(f.run(dev, step({seq(1, 0, {3, 4})})));
    CHECK(f.run(dev, step({seq(2, 0, {5})})));
    CHECK(f.run(dev, step({seq(1, 2, {6})})));
    CHECK(metrics.expose().find("troupe_device_evictions_total{device=\"gpu\"} 2\n") !=
          std::string::npos);
    f.self->send_exit(dev, caf::exit_reason::user_shutdown);  // before `metrics` goes
  }
}

/// Speculative decoding on a CUDA device: steps that verify drafts (the CPU device's greedy
/// tokens, one of them wrong in most rounds) draw exactly the CPU device's one-token greedy
/// tokens, the rejected drafts rolled back on the device, while the device proposes its own
/// drafts (the DSpark layers on the device, from its features) at every step. Both
/// devices are batch-invariant, as troupe serve's are: a verify step's rows then round as the
/// one-token steps' do (otherwise the GEMMs' row-count-dependent sums move an fp8 / fp4 code of
/// the cached rows now and then, and a logprob by up to 1e-3).
inline void check_speculation(device_fixture& f) {
  kernels::cuda::cuda_backend_options invariant;
  invariant.batch_invariant = true;
  auto gpu = f.cpu(cuda_params(invariant));
  auto host = f.cpu(tiny_params());
  const auto pr = prompt(20, 9);
  std::vector<float> ref_lp;
  const auto ref = f.greedy(host, 1, pr, 30, &ref_lp);
  const runtime::sampling greedy{.temperature = 0.0, .top_logprobs = 0};
  auto first = seq(3, 0, pr, true, greedy);
  first.propose = true;
  auto r = f.run(gpu, step({first}));
  REQUIRE_MESSAGE(r, f.sys.render(r.error()));
  std::vector<runtime::sampled_token> got{r->sampled.at(0)};
  std::uint32_t accepted = 0, rejected = 0, proposals = 0;
  for (std::uint32_t round = 0; got.size() + 6 <= ref.size(); ++round) {
    REQUIRE(r->drafts.size() == 1);  // the device proposed for the sequence that asked
    CHECK_FALSE(r->drafts[0].tokens.empty());
    ++proposals;
    const std::uint32_t k = 1 + round % 5, wrong = (round * 3) % (k + 1);
    std::vector<std::int32_t> tokens{got.back().token};
    for (std::uint32_t j = 0; j < k; ++j) {
      const auto t = ref[got.size() + j];
      tokens.push_back(j == wrong ? (t + 1) % 256 : t);
    }
    auto s = seq(3, pr.size() + got.size() - 1, tokens, true, greedy);
    s.verify = k;
    s.propose = true;
    r = f.run(gpu, step({s}));
    REQUIRE_MESSAGE(r, f.sys.render(r.error()));
    const auto answered = std::min(wrong, k) + 1;
    REQUIRE(r->sampled.size() == answered);
    accepted += answered - 1;
    rejected += k - (answered - 1);
    got.insert(got.end(), r->sampled.begin(), r->sampled.end());
  }
  CHECK(accepted > 0);
  CHECK(rejected > 0);
  CHECK(proposals > 3);
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].token == ref[i]);
    CHECK(std::fabs(got[i].logprob - ref_lp[i]) < 1e-4);
  }
}

/// Expert-parallel load balancing on a CUDA device (serve --eplb): the router's counts reach the
/// expert link as a CPU device's do for the same step, and a placement with replicas over three
/// ranks is applied at the next step with the same greedy token (batch-invariant devices).
inline void check_expert_link(device_fixture& f) {
  const std::int32_t experts = 8;  // the tiny preset's routed experts
  auto link_for = [&](ports::cpu_device_params p, runtime::registry& metrics) {
    auto link = std::make_shared<ports::expert_link>(experts);
    p.experts = link;
    p.metrics = &metrics;
    p.name = "d";
    return std::pair{f.cpu(std::move(p)), link};
  };
  kernels::cuda::cuda_backend_options invariant;
  invariant.batch_invariant = true;
  runtime::registry gpu_metrics, host_metrics;
  auto [gpu, gpu_link] = link_for(cuda_params(invariant), gpu_metrics);
  auto [host, host_link] = link_for(tiny_params(), host_metrics);
  const auto pr = prompt(30, 5);
  const auto first = f.token(gpu, step({seq(1, 0, pr)}));
  CHECK(first == f.token(host, step({seq(1, 0, pr)})));
  const auto counts = gpu_link->totals();
  CHECK(counts == host_link->totals());
  CHECK(std::accumulate(counts.begin(), counts.end(), std::uint64_t{0}) > 0);
  // Two hot experts copied: the next step runs three ranks, the same token as one group.
  const std::int32_t hot[] = {1, 6};
  auto placed = kernels::place_experts(experts, 3, hot);
  REQUIRE(placed);
  gpu_link->propose(*placed);
  host_link->propose(*placed);
  const auto second = f.token(gpu, step({seq(1, pr.size(), {first})}));
  CHECK(second == f.token(host, step({seq(1, pr.size(), {first})})));
  const std::string applied =
    "troupe_device_expert_placements_total{device=\"d\",outcome=\"applied\"} 1\n";
  CHECK(gpu_metrics.expose().find(applied) != std::string::npos);
  CHECK(host_metrics.expose().find(applied) != std::string::npos);
  f.self->send_exit(gpu, caf::exit_reason::user_shutdown);  // before the registries go
  f.self->send_exit(host, caf::exit_reason::user_shutdown);
}

} // namespace troupe::test

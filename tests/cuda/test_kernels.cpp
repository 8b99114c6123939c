// The CUDA kernels against the CPU model's math on small random inputs (tolerances stated per
// test; the permutations exactly).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "device_buffer.hpp"
#include "tests/cuda_host/kernel_test_support.hpp"
#include "kernels/cpu_ops.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/ep_dispatch.hpp"
#include "kernels/kv_cache.hpp"
#include "kernels/portable_math.hpp"

using namespace troupe::kernels;
using troupe::test::cpu_query_attention;
using troupe::test::device_buffer;
using troupe::test::max_abs_diff;
using troupe::test::released_rope;
using troupe::test::window_args;
using troupe::test::random_values;

namespace {
// The largest |a − b| / max(|b|, floor) over the elements.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - b[i]) / std::max(std::fabs(double(b[i])), floor));
  return m;
}
}  // namespace

TEST_CASE("RMSNorm on the device matches the CPU's within 1e-5 relative") {
  const std::int64_t rows = 7, n = 5120;
  auto x = random_values(static_cast<std::size_t>(rows * n), 1, -3, 3);
  const auto w = random_values(static_cast<std::size_t>(n), 2, 0.5f, 1.5f);
  device_buffer<float> dx(x), dw(w);
  REQUIRE(cuda::rms_norm(dx.get(), rows, n, dw.get(), 1e-6f).ok());
  const auto got = dx.download();
  for (std::int64_t r = 0; r < rows; ++r) rms_norm(x.data() + r * n, n, w.data(), 1e-6f);
  CHECK(max_abs_diff(got, x) <= 1e-5 * 1.5 * 3);
}

TEST_CASE("decode attention over the window (and CSA2's selected entries) matches the CPU's within 2e-5") {
  // The released shapes of a sliding-window layer (64 heads of 512, window 128, rope 64), three
  // sequences at different points: one short, two whose ring has wrapped, one after a reset;
  // then as a CSA2 layer: after the window, 0, 5 and 64 selected rows of a compressed KV.
  const std::int64_t H = 64, hd = 512, win = 128, cap = win + swa_rollback_tokens, B = 3;
  const std::vector<std::int64_t> positions{5, 300, 1000}, starts{0, 0, 950};
  const rope_table rope = released_rope();
  std::vector<float> rings(static_cast<std::size_t>(B * cap * hd), 0.0f);
  std::vector<std::int64_t> begin(B);
  std::vector<swa_ring> cpu;
  for (std::int64_t b = 0; b < B; ++b) {
    swa_ring ring(hd, cap);
    ring.reset(starts[static_cast<std::size_t>(b)]);
    for (std::int64_t p = starts[static_cast<std::size_t>(b)]; p <= positions[static_cast<std::size_t>(b)]; ++p) {
      auto row = random_values(static_cast<std::size_t>(hd), static_cast<std::uint32_t>(1000 * b + p));
      ring.push(row.data());
    }
    begin[static_cast<std::size_t>(b)] = ring.begin();
    for (std::int64_t p = ring.begin(); p < ring.end(); ++p)
      std::copy_n(ring.at(p), hd, rings.data() + (b * cap + p % cap) * hd);
    cpu.push_back(std::move(ring));
  }
  const auto q = random_values(static_cast<std::size_t>(B * H * hd), 7, -0.2f, 0.2f);
  const auto sinks = random_values(static_cast<std::size_t>(H), 8);

  // The compressed KV of a CSA2 layer and each sequence's selected rows of it.
  const std::int64_t n_comp = 200, max_sel = 64;
  const auto compressed = random_values(static_cast<std::size_t>(n_comp * hd), 9);
  const std::vector<std::int64_t> n_sel{0, 5, 64};
  std::vector<std::int64_t> selected(static_cast<std::size_t>(B * max_sel), 0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t k = 0; k < n_sel[static_cast<std::size_t>(b)]; ++k)
      selected[static_cast<std::size_t>(b * max_sel + k)] = (k * 37 + b * 11) % n_comp;

  device_buffer<float> dq(q), drings(rings), dsinks(sinks), dfreq(rope.inv_freq),
      dcomp(compressed), dout(static_cast<std::size_t>(B * H * hd));
  device_buffer<std::int64_t> dpos(positions), dbegin(begin), dsel(selected), dnsel(n_sel);
  for (const bool csa : {false, true}) {
    CAPTURE(csa);
    auto a = window_args(dq.get(), drings.get(), dpos.get(), dbegin.get(), dsinks.get(),
                         dfreq.get(), dout.get(), B, H, cap, win, rope);
    if (csa) {
      a.compressed = dcomp.get();
      a.selected = dsel.get();
      a.n_selected = dnsel.get();
      a.max_selected = max_sel;
    }
    REQUIRE(cuda::swa_decode_attention(a).ok());
    const auto got = dout.download();

    // The CPU model's computation (kernels/model.cpp: the window's rows, then the selected
    // compressed rows, through sink_attention), written out.
    std::vector<float> want(got.size());
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t p = positions[static_cast<std::size_t>(b)];
      cpu_query_attention(q.data() + b * H * hd, H, cpu[static_cast<std::size_t>(b)], p, win,
                          p + 1, nullptr, compressed.data(), selected.data() + b * max_sel,
                          csa ? n_sel[static_cast<std::size_t>(b)] : 0, sinks.data(), rope,
                          want.data() + b * H * hd);
    }
    CHECK(max_abs_diff(got, want) <= 2e-5);
  }
  cuda::swa_decode_args too_many;  // window + selected above swa_max_keys: refused
  too_many.batch = 1;
  too_many.window = win;
  too_many.capacity = cap;
  too_many.n_selected = dnsel.get();
  too_many.compressed = dcomp.get();
  too_many.selected = dsel.get();
  too_many.max_selected = cuda::swa_max_keys;
  CHECK(!cuda::swa_decode_attention(too_many).ok());
}

TEST_CASE("the device gather and combine equal the host plan's bit for bit") {
  const auto c = troupe::test::make_moe_case(33, 6, 384, 8, 61, 1024, 11);
  device_buffer<float> dx(c.x), dw(c.weights), dret(c.returned), dg(c.gathered.size()),
      dy(c.combined.size());
  device_buffer<std::int32_t> dsend(c.plan.send_copy), drow(c.plan.copy_row);
  REQUIRE(cuda::moe_gather_rows(dx.get(), dsend.get(), c.rows, c.k, c.width, dg.get()).ok());
  REQUIRE(cuda::moe_combine_rows(dret.get(), drow.get(), dw.get(), c.T, c.k, c.width, dy.get())
              .ok());
  const auto g = dg.download(), y = dy.download();
  CHECK(std::memcmp(g.data(), c.gathered.data(), g.size() * 4) == 0);
  CHECK(std::memcmp(y.data(), c.combined.data(), y.size() * 4) == 0);
}

TEST_CASE("the cuBLASLt BF16 GEMM matches an fp32 GEMM of the same BF16 values within 1e-4 relative") {
  for (auto [m, n, kk, batch] : {std::array<std::int64_t, 4>{1, 4096, 5120, 1},
                                 std::array<std::int64_t, 4>{37, 1000, 768, 1},
                                 std::array<std::int64_t, 4>{64, 512, 256, 4}}) {
    CAPTURE(m);
    CAPTURE(n);
    auto x = random_values(static_cast<std::size_t>(batch * m * kk), 21);
    auto w = random_values(static_cast<std::size_t>(batch * n * kk), 22, -0.05f, 0.05f);
    std::vector<std::uint16_t> xb(x.size()), wb(w.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = cuda::from_bf16(xb[i] = cuda::to_bf16(x[i]));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = cuda::from_bf16(wb[i] = cuda::to_bf16(w[i]));
    std::vector<float> want(static_cast<std::size_t>(batch * m * n));
    for (std::int64_t b = 0; b < batch; ++b)
      linear(x.data() + b * m * kk, m, kk, w.data() + b * n * kk, n, want.data() + b * m * n);
    auto gemm = cuda::lt_gemm::create();
    REQUIRE(gemm.ok());
    device_buffer<std::uint16_t> dx(xb), dw(wb);
    device_buffer<float> dy(want.size());
    auto ran = gemm->run(dx.get(), dw.get(), dy.get(), m, n, kk, batch);
    REQUIRE_MESSAGE(ran.ok(), ran.error());
    const auto got = dy.download();
    double scale = 0;
    for (float v : want) scale = std::max(scale, double(std::fabs(v)));
    CHECK(max_abs_diff(got, want) <= 1e-4 * scale);
  }
}

// The mHC, Engram and SwiGLU kernels run the CPU engine's own functions
// (kernels/portable_math.hpp) per thread with FMA contraction off: what uses no exponential
// is bitwise the CPU's; what does differs by the device's expf (2 ulp) as it propagates.
TEST_CASE("mHC collapse and expand on the device equal the CPU's bit for bit") {
  const std::int64_t T = 5, hc = 4, D = 4096;
  const auto streams = random_values(static_cast<std::size_t>(T * hc * D), 31, -4, 4);
  const auto pre = random_values(static_cast<std::size_t>(T * hc), 32, 0, 1);
  const auto post = random_values(static_cast<std::size_t>(T * hc), 33, 0, 2);
  const auto comb = random_values(static_cast<std::size_t>(T * hc * hc), 34, 0, 1);
  const auto x = random_values(static_cast<std::size_t>(T * D), 35, -4, 4);
  std::vector<float> collapsed(static_cast<std::size_t>(T * D)), expanded(streams.size());
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t d = 0; d < D; ++d) {
      collapsed[static_cast<std::size_t>(t * D + d)] =
          portable::hc_collapse_at(streams.data(), pre.data(), hc, D, t, d);
      for (std::int64_t k = 0; k < hc; ++k)
        expanded[static_cast<std::size_t>((t * hc + k) * D + d)] = portable::hc_expand_at(
            streams.data(), x.data(), post.data(), comb.data(), hc, D, t, k, d);
    }
  device_buffer<float> ds(streams), dpre(pre), dpost(post), dcomb(comb), dx(x),
      dc(collapsed.size()), de(expanded.size());
  REQUIRE(cuda::hc_collapse(ds.get(), dpre.get(), T, hc, D, dc.get()).ok());
  REQUIRE(cuda::hc_expand(ds.get(), dx.get(), dpost.get(), dcomb.get(), T, hc, D, de.get()).ok());
  const auto c = dc.download(), e = de.download();
  CHECK(std::memcmp(c.data(), collapsed.data(), c.size() * 4) == 0);
  CHECK(std::memcmp(e.data(), expanded.data(), e.size() * 4) == 0);
}

TEST_CASE("the device's mHC mixes match the CPU's within 1e-5") {
  const std::int64_t T = 64, hc = 4, mix = (2 + hc) * hc, iters = 20;
  const float hc_eps = 1e-6f;
  const auto mixes = random_values(static_cast<std::size_t>(T * mix), 41, -3, 3);
  const auto scale = random_values(3, 42, 0.5f, 2);
  const auto base = random_values(static_cast<std::size_t>(mix), 43, -1, 1);
  std::vector<float> pre(static_cast<std::size_t>(T * hc)), post(pre.size()),
      comb(static_cast<std::size_t>(T * hc * hc));
  for (std::int64_t t = 0; t < T; ++t)
    portable::hc_token_mixes(mixes.data() + t * mix, scale.data(), base.data(), hc, iters,
                             hc_eps, pre.data() + t * hc, post.data() + t * hc,
                             comb.data() + t * hc * hc);
  device_buffer<float> dm(mixes), dscale(scale), dbase(base), dpre(pre.size()),
      dpost(post.size()), dcomb(comb.size());
  REQUIRE(cuda::hc_mixes(dm.get(), dscale.get(), dbase.get(), T, hc, iters, hc_eps, dpre.get(),
                         dpost.get(), dcomb.get())
              .ok());
  CHECK(max_abs_diff(dpre.download(), pre) <= 1e-6);
  CHECK(max_abs_diff(dpost.download(), post) <= 2e-6);
  CHECK(max_abs_diff(dcomb.download(), comb) <= 1e-5);
}

TEST_CASE("Engram's gated add on the device matches the CPU's within 1e-5 (relative above 1)") {
  const std::int64_t T = 3, hc = 4, D = 4096;
  const float eps = 1e-6f;
  auto streams = random_values(static_cast<std::size_t>(T * hc * D), 51, -2, 2);
  const auto kv = random_values(static_cast<std::size_t>(T * (hc + 1) * D), 52, -2, 2);
  const auto weight = random_values(static_cast<std::size_t>(hc * D), 53, 0, 2);
  device_buffer<float> ds(streams), dkv(kv), dw(weight);
  REQUIRE(cuda::engram_gate_add(ds.get(), dkv.get(), dw.get(), T, hc, D, eps).ok());
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t k = 0; k < hc; ++k) {
      float* h = streams.data() + (t * hc + k) * D;
      const float* row = kv.data() + t * (hc + 1) * D;
      const float gate = portable::engram_gate(h, row + k * D, weight.data() + k * D, D, eps);
      for (std::int64_t d = 0; d < D; ++d) h[d] = h[d] + gate * row[hc * D + d];
    }
  CHECK(max_rel_diff(ds.download(), streams, 1.0) <= 1e-5);
}

TEST_CASE("the device's clamped SwiGLU matches the CPU's within 1e-6 relative, row scales or not") {
  const std::int64_t rows = 7, width = 2048;
  const float limit = 10.0f;
  const auto g0 = random_values(static_cast<std::size_t>(rows * width), 61, -15, 15);
  const auto u = random_values(g0.size(), 62, -15, 15);
  const auto row_scale = random_values(static_cast<std::size_t>(rows), 63, 0, 1);
  for (const bool scaled : {false, true}) {
    CAPTURE(scaled);
    auto want = g0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < width; ++i) {
        auto& v = want[static_cast<std::size_t>(r * width + i)];
        v = portable::swiglu(v, u[static_cast<std::size_t>(r * width + i)], limit, scaled,
                             scaled ? row_scale[static_cast<std::size_t>(r)] : 1.0f);
      }
    device_buffer<float> dg(g0), du(u), dscale(row_scale);
    REQUIRE(cuda::swiglu(dg.get(), du.get(), rows, width, limit,
                         scaled ? dscale.get() : nullptr)
                .ok());
    CHECK(max_rel_diff(dg.download(), want, 1e-6) <= 1e-6);
  }
}

TEST_CASE("the device's fp8 and fp4 cache quantisers equal the CPU's bit for bit") {
  // Blocks of every scale: values from 1e-6 (below the fp8 scale's 1e-4 floor) to 1e3.
  const std::int64_t n = 64 * 512;
  auto x = random_values(static_cast<std::size_t>(n), 71, -1, 1);
  for (std::int64_t i = 0; i < n; ++i)
    x[static_cast<std::size_t>(i)] *= std::pow(10.0f, static_cast<float>((i / 32) % 10) - 6.0f);
  struct form {
    bool fp4;
    std::int64_t block;
    bool e4m3_scales;
  };
  for (const form f : {form{false, 32, false}, form{true, 32, false}, form{true, 16, true}}) {
    CAPTURE(f.fp4);
    CAPTURE(f.block);
    auto want = x;
    if (f.fp4)
      fake_quant_fp4_block(want.data(), n, f.block, f.e4m3_scales);
    else
      fake_quant_fp8_block32(want.data(), n);
    device_buffer<float> dx(x);
    REQUIRE((f.fp4 ? cuda::quant_fp4_blocks(dx.get(), n, f.block, f.e4m3_scales)
                   : cuda::quant_fp8_blocks(dx.get(), n, f.block))
                .ok());
    const auto got = dx.download();
    CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
  }
  device_buffer<float> dx(x);
  CHECK(!cuda::quant_fp8_blocks(dx.get(), 40, 32).ok());  // not whole blocks: refused
}

TEST_CASE("RoPE on the device matches the CPU's apply_rope within 1e-6 of the row's scale") {
  // Queries of 4 heads per token (one position per token) and the inverse rotation, on the
  // released head shape (512 channels, the last 64 rotated) at positions up to 100k.
  const std::int64_t T = 6, H = 4, hd = 512;
  const rope_table rope = released_rope();
  const std::vector<std::int64_t> positions{0, 1, 127, 4096, 65535, 100000};
  const auto x = random_values(static_cast<std::size_t>(T * H * hd), 81, -3, 3);
  for (const bool inverse : {false, true}) {
    CAPTURE(inverse);
    auto want = x;
    for (std::int64_t r = 0; r < T * H; ++r)
      apply_rope(want.data() + r * hd, hd, rope, positions[static_cast<std::size_t>(r / H)], inverse);
    device_buffer<float> dx(x), dfreq(rope.inv_freq);
    device_buffer<std::int64_t> dpos(positions);
    REQUIRE(cuda::rope_rows(dx.get(), T * H, hd, dfreq.get(), rope.rope_dim, rope.scaling,
                            dpos.get(), H, inverse)
                .ok());
    CHECK(max_abs_diff(dx.download(), want) <= 1e-6 * 3 * 2);
  }
}

TEST_CASE("the device's MoE router picks the CPU's experts, weights within 1e-6 relative") {
  // The released router's shape (384 experts, top 6, sqrtsoftplus, normalised, scaled 2.5) and
  // the other two scoring functions; a bias that moves choices, and tied logits.
  const std::int64_t T = 40, n = 384, k = 6;
  auto logits = random_values(static_cast<std::size_t>(T * n), 91, -4, 4);
  for (std::int64_t e = 0; e < 8; ++e) logits[static_cast<std::size_t>(e)] = 1.5f;  // a tie
  const auto bias = random_values(static_cast<std::size_t>(n), 92, -0.05f, 0.05f);
  for (const char* func : {"sqrtsoftplus", "sigmoid", "softmax"}) {
    CAPTURE(func);
    text_config c;
    c.n_routed_experts = n;
    c.num_experts_per_tok = k;
    c.scoring_func = func;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    std::vector<std::int64_t> want_e;
    std::vector<float> want_w;
    auto scores = logits;
    std::vector<std::int64_t> e1;
    std::vector<float> w1;
    for (std::int64_t t = 0; t < T; ++t) {
      route_token(c, scores.data() + t * n, bias.data(), e1, w1);
      want_e.insert(want_e.end(), e1.begin(), e1.end());
      want_w.insert(want_w.end(), w1.begin(), w1.end());
    }
    const auto f = std::string(func) == "sqrtsoftplus" ? portable::router_scoring::sqrtsoftplus
                   : std::string(func) == "sigmoid"    ? portable::router_scoring::sigmoid
                                                        : portable::router_scoring::softmax;
    device_buffer<float> ds(logits), db(bias), dw(want_w.size());
    device_buffer<std::int64_t> de(want_e.size());
    REQUIRE(cuda::route_tokens(ds.get(), db.get(), T, n, k, f, 1.0f, true, 2.5f, de.get(),
                               dw.get())
                .ok());
    CHECK(de.download() == want_e);
    CHECK(max_rel_diff(dw.download(), want_w, 1e-3) <= 1e-6);
  }
}

TEST_CASE("the CSA2 compressor's pooling (within 4e-6) and indexer scores (bitwise) on the device") {
  const std::int64_t groups = 9, r = 4, hd = 512;
  const auto kv = random_values(static_cast<std::size_t>(groups * r * hd), 101, -2, 2);
  const auto gate = random_values(kv.size(), 102, -6, 6);
  std::vector<float> pooled(static_cast<std::size_t>(groups * hd));
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t d = 0; d < hd; ++d)
      pooled[static_cast<std::size_t>(g * hd + d)] =
          portable::compress_pool_at(kv.data(), gate.data(), r, hd, g, d);
  device_buffer<float> dkv(kv), dgate(gate), dpool(pooled.size());
  REQUIRE(cuda::compress_pool(dkv.get(), dgate.get(), groups, r, hd, dpool.get()).ok());
  CHECK(max_abs_diff(dpool.download(), pooled) <= 4e-6);  // |kv| <= 2, weights within ~5e-7

  // The released indexer: 64 heads, scores over 1,000 entries for 5 queries.
  const std::int64_t Q = 5, nh = 64, n = 1000;
  const auto dots = random_values(static_cast<std::size_t>(Q * nh * n), 103, -3, 3);
  const auto w = random_values(static_cast<std::size_t>(Q * nh), 104, -1, 1);
  const float sm_scale = 1.0f / std::sqrt(128.0f), heads_scale = 1.0f / std::sqrt(64.0f);
  std::vector<float> scores(static_cast<std::size_t>(Q * n));
  for (std::int64_t q = 0; q < Q; ++q)
    for (std::int64_t e = 0; e < n; ++e)
      scores[static_cast<std::size_t>(q * n + e)] = portable::index_score(
          dots.data() + q * nh * n + e, n, w.data() + q * nh, nh, sm_scale, heads_scale);
  device_buffer<float> ddots(dots), dw(w), dscores(scores.size());
  REQUIRE(cuda::index_scores(ddots.get(), dw.get(), Q, nh, n, sm_scale, heads_scale,
                             dscores.get())
              .ok());
  const auto got = dscores.download();
  CHECK(std::memcmp(got.data(), scores.data(), got.size() * 4) == 0);
}

TEST_CASE("the device's FP8 and FP4 weight dequantisation equals the CPU decoders bit for bit") {
  // A released-shaped FP8 block (4 x 3 blocks of 128 x 128, ragged at the edges) and an FP4
  // expert matrix (per-32 scales), random codes (no NaN e4m3 codes) and scales around 2^0.
  const std::int64_t rows = 400, cols = 300, fr = 64, fc = 2048;
  std::mt19937 g(111);
  std::vector<std::uint8_t> w8(static_cast<std::size_t>(rows * cols)), s8(4 * 3),
      w4(static_cast<std::size_t>(fr * fc / 2)), s4(static_cast<std::size_t>(fr * fc / 32));
  for (auto& b : w8) do b = static_cast<std::uint8_t>(g()); while ((b & 0x7f) == 0x7f);
  for (auto& b : w4) b = static_cast<std::uint8_t>(g());
  for (auto* v : {&s8, &s4})
    for (auto& b : *v) b = static_cast<std::uint8_t>(120 + g() % 16);
  std::vector<float> want8(w8.size()), want4(static_cast<std::size_t>(fr * fc));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      want8[static_cast<std::size_t>(i * cols + j)] =
          portable::fp8_block_weight(w8.data(), s8.data(), cols, 128, 128, i, j);
  for (std::int64_t i = 0; i < fr; ++i)
    for (std::int64_t j = 0; j < fc; ++j)
      want4[static_cast<std::size_t>(i * fc + j)] =
          portable::fp4_packed_weight(w4.data(), s4.data(), fc, 32, i, j);
  device_buffer<std::uint8_t> dw8(w8), ds8(s8), dw4(w4), ds4(s4);
  device_buffer<float> d8(want8.size()), d4(want4.size());
  REQUIRE(cuda::dequant_fp8_blocks(dw8.get(), ds8.get(), rows, cols, 128, 128, d8.get()).ok());
  REQUIRE(cuda::dequant_fp4(dw4.get(), ds4.get(), fr, fc, 32, d4.get()).ok());
  const auto got8 = d8.download(), got4 = d4.download();
  CHECK(std::memcmp(got8.data(), want8.data(), got8.size() * 4) == 0);
  CHECK(std::memcmp(got4.data(), want4.data(), got4.size() * 4) == 0);
  CHECK(!cuda::dequant_fp4(dw4.get(), ds4.get(), fr, 33, 32, d4.get()).ok());  // ragged: refused
}

TEST_CASE("prefill attention: a chunk's queries over their ring and the chunk match the CPU's within 2e-5") {
  // Two sequences in one call: one whose ring holds positions 0 … 149 and whose chunk is 150 …
  // 189, one fresh (chunk 0 … 24); some queries also take selected compressed rows.
  const std::int64_t H = 16, hd = 512, win = 128, cap = win + swa_rollback_tokens;
  const rope_table rope = released_rope();
  const std::vector<std::int64_t> start{150, 0}, len{40, 25};
  std::vector<swa_ring> cpu;
  std::vector<float> rings(static_cast<std::size_t>(2 * cap * hd), 0.0f);
  std::vector<std::int64_t> begin;
  for (std::int64_t s = 0; s < 2; ++s) {
    swa_ring ring(hd, cap);
    for (std::int64_t p = 0; p < start[static_cast<std::size_t>(s)]; ++p)
      ring.push(random_values(static_cast<std::size_t>(hd), static_cast<std::uint32_t>(5000 + p)).data());
    begin.push_back(ring.begin());
    for (std::int64_t p = ring.begin(); p < ring.end(); ++p)
      std::copy_n(ring.at(p), hd, rings.data() + (s * cap + p % cap) * hd);
    cpu.push_back(std::move(ring));
  }
  const std::int64_t Q = 65, max_sel = 8, n_comp = 50;
  const auto chunk = random_values(static_cast<std::size_t>(Q * hd), 121);
  const auto compressed = random_values(static_cast<std::size_t>(n_comp * hd), 122);
  const auto q = random_values(static_cast<std::size_t>(Q * H * hd), 123, -0.2f, 0.2f);
  const auto sinks = random_values(static_cast<std::size_t>(H), 124);
  std::vector<std::int64_t> positions, sequence, chunk_start, chunk_row, n_sel,
      selected(static_cast<std::size_t>(Q * max_sel), 0);
  for (std::int64_t s = 0, row = 0; s < 2; ++s)
    for (std::int64_t i = 0; i < len[static_cast<std::size_t>(s)]; ++i) {
      positions.push_back(start[static_cast<std::size_t>(s)] + i);
      sequence.push_back(s);
      chunk_start.push_back(start[static_cast<std::size_t>(s)]);
      chunk_row.push_back(row - i);  // the chunk row of the sequence's first position
      const std::int64_t b = row++;
      n_sel.push_back((b % 3) * 4);
      for (std::int64_t k = 0; k < n_sel.back(); ++k)
        selected[static_cast<std::size_t>(b * max_sel + k)] = (b * 7 + k * 13) % n_comp;
    }
  device_buffer<float> dq(q), drings(rings), dsinks(sinks), dfreq(rope.inv_freq), dchunk(chunk),
      dcomp(compressed), dout(static_cast<std::size_t>(Q * H * hd));
  device_buffer<std::int64_t> dpos(positions), dbegin(begin), dseq(sequence), dstart(chunk_start),
      drow(chunk_row), dsel(selected), dnsel(n_sel);
  auto a = window_args(dq.get(), drings.get(), dpos.get(), dbegin.get(), dsinks.get(), dfreq.get(),
                       dout.get(), Q, H, cap, win, rope);
  a.compressed = dcomp.get();
  a.selected = dsel.get();
  a.n_selected = dnsel.get();
  a.max_selected = max_sel;
  a.chunk = dchunk.get();
  a.sequence = dseq.get();
  a.chunk_start = dstart.get();
  a.chunk_row = drow.get();
  REQUIRE(cuda::swa_decode_attention(a).ok());
  const auto got = dout.download();

  // kernels/model.cpp's attention_site for these queries, written out.
  std::vector<float> want(got.size());
  for (std::int64_t b = 0; b < Q; ++b) {
    const auto bi = static_cast<std::size_t>(b);
    cpu_query_attention(q.data() + b * H * hd, H, cpu[static_cast<std::size_t>(sequence[bi])],
                        positions[bi], win, chunk_start[bi], chunk.data() + chunk_row[bi] * hd,
                        compressed.data(), selected.data() + b * max_sel, n_sel[bi],
                        sinks.data(), rope, want.data() + b * H * hd);
  }
  CHECK(max_abs_diff(got, want) <= 2e-5);
}

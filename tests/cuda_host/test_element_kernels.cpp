// The CUDA kernels that run one CPU-engine function per thread (kernels/cuda/element_kernels.cuh)
// on the CPU under the SIMT emulator (simt.hpp): each functor's mapping from a thread's index to
// its token, element or block, against the CPU engine's own loops. With the host's math the
// results must be the CPU's bit for bit.
#include "simt.hpp"  // first: the CUDA spellings the kernels' header uses

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu_ops.hpp"
#include "kernels/cuda/element_kernels.cuh"
#include "kernels/safetensors.hpp"
#include "tests/cuda_host/kernel_test_support.hpp"

using namespace troupe::kernels;
namespace simt = troupe::test::simt;
using troupe::test::random_values;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// f(i) for i in [0, n) as the device launches it: blocks of 64 threads, the last one partial.
template <class F>
void run_each(std::int64_t n, F f) {
  const unsigned threads = 64, blocks = static_cast<unsigned>((n + threads - 1) / threads);
  simt::launch({blocks}, {threads}, 0, cuda::each_index<F>, n, f);
}

}  // namespace

TEST_CASE("emulated: the mHC kernels index tokens, streams and channels as the CPU loops do") {
  const std::int64_t T = 3, hc = 4, D = 40, mix = (2 + hc) * hc;
  const auto streams = random_values(static_cast<std::size_t>(T * hc * D), 1, -3, 3);
  const auto pre = random_values(static_cast<std::size_t>(T * hc), 2, 0, 1);
  const auto post = random_values(static_cast<std::size_t>(T * hc), 3, 0, 2);
  const auto comb = random_values(static_cast<std::size_t>(T * hc * hc), 4, 0, 1);
  const auto x = random_values(static_cast<std::size_t>(T * D), 5, -3, 3);
  std::vector<float> collapsed(static_cast<std::size_t>(T * D)), expanded(streams.size());
  std::vector<float> want_c(collapsed.size()), want_e(expanded.size());
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t d = 0; d < D; ++d) {
      float o = 0.0f;  // the CPU's loop: Σ_j pre · stream, j ascending
      for (std::int64_t j = 0; j < hc; ++j)
        o += pre[static_cast<std::size_t>(t * hc + j)] *
             streams[static_cast<std::size_t>((t * hc + j) * D + d)];
      want_c[static_cast<std::size_t>(t * D + d)] = o;
      for (std::int64_t k = 0; k < hc; ++k)
        want_e[static_cast<std::size_t>((t * hc + k) * D + d)] = portable::hc_expand_at(
            streams.data(), x.data(), post.data(), comb.data(), hc, D, t, k, d);
    }
  run_each(T * D, cuda::collapse_fn{streams.data(), pre.data(), hc, D, collapsed.data()});
  run_each(T * hc * D,
           cuda::expand_fn{streams.data(), x.data(), post.data(), comb.data(), hc, D,
                           expanded.data()});
  CHECK(same_bits(collapsed, want_c));
  CHECK(same_bits(expanded, want_e));

  const auto mixes = random_values(static_cast<std::size_t>(T * mix), 6, -3, 3);
  const auto scale = random_values(3, 7, 0.5f, 2);
  const auto base = random_values(static_cast<std::size_t>(mix), 8);
  std::vector<float> p(static_cast<std::size_t>(T * hc)), q(p.size()), c(comb.size());
  std::vector<float> wp(p.size()), wq(p.size()), wc(c.size());
  for (std::int64_t t = 0; t < T; ++t)
    portable::hc_token_mixes(mixes.data() + t * mix, scale.data(), base.data(), hc, 20, 1e-6f,
                             wp.data() + t * hc, wq.data() + t * hc, wc.data() + t * hc * hc);
  run_each(T, cuda::mixes_fn{mixes.data(), scale.data(), base.data(), hc, 20, 1e-6f, p.data(),
                             q.data(), c.data()});
  CHECK(same_bits(p, wp));
  CHECK(same_bits(q, wq));
  CHECK(same_bits(c, wc));
}

TEST_CASE("emulated: RoPE, the quantisers and SwiGLU kernels equal the CPU engine's functions") {
  // RoPE: 3 tokens × 4 heads of 512 channels, a token's heads at its position.
  const std::int64_t T = 3, H = 4, hd = 512;
  rope_parameters rp;
  rp.partial_rotary_factor = 64.0 / 512.0;
  const rope_table rope = make_rope_table(rp, hd);
  const std::vector<std::int64_t> positions{0, 77, 4096};
  auto x = random_values(static_cast<std::size_t>(T * H * hd), 11, -3, 3), want = x;
  for (std::int64_t r = 0; r < T * H; ++r)
    apply_rope(want.data() + r * hd, hd, rope, positions[static_cast<std::size_t>(r / H)]);
  run_each(T * H * (rope.rope_dim / 2),
           cuda::rope_fn{x.data(), hd, rope.rope_dim, H, rope.inv_freq.data(), rope.scaling,
                         positions.data(), false});
  CHECK(same_bits(x, want));

  // The fp8 and fp4 cache quantisers, one thread per block.
  auto v = random_values(32 * 40, 12, -50, 50), w8 = v, w4 = v, v8 = v, v4 = v;
  fake_quant_fp8_block32(w8.data(), 32 * 40);
  fake_quant_fp4_block(w4.data(), 32 * 40, 16, true);
  run_each(40, cuda::quant_fn{v8.data(), 32, false, false});
  run_each(80, cuda::quant_fn{v4.data(), 16, true, true});
  CHECK(same_bits(v8, w8));
  CHECK(same_bits(v4, w4));

  // SwiGLU with row scales: rows of 96.
  const std::int64_t rows = 5, width = 96;
  auto g = random_values(static_cast<std::size_t>(rows * width), 13, -15, 15), wg = g;
  const auto u = random_values(g.size(), 14, -15, 15);
  const auto row_scale = random_values(static_cast<std::size_t>(rows), 15, 0, 1);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < width; ++i) {
      auto& e = wg[static_cast<std::size_t>(r * width + i)];
      e = portable::swiglu(e, u[static_cast<std::size_t>(r * width + i)], 10.0f, true,
                           row_scale[static_cast<std::size_t>(r)]);
    }
  run_each(rows * width, cuda::swiglu_fn{g.data(), u.data(), width, 10.0f, row_scale.data()});
  CHECK(same_bits(g, wg));
}

TEST_CASE("emulated: the router, CSA2 and weight kernels equal the CPU engine's functions") {
  // The router: 5 tokens over 384 experts, top 6, as cpu_ops' route_token.
  const std::int64_t T = 5, n = 384, k = 6;
  const auto logits = random_values(static_cast<std::size_t>(T * n), 21, -4, 4);
  const auto bias = random_values(static_cast<std::size_t>(n), 22, -0.05f, 0.05f);
  text_config c;
  c.n_routed_experts = n;
  c.num_experts_per_tok = k;
  std::vector<std::int64_t> want_e, e1;
  std::vector<float> want_w, w1, scores = logits;
  for (std::int64_t t = 0; t < T; ++t) {
    route_token(c, scores.data() + t * n, bias.data(), e1, w1);
    want_e.insert(want_e.end(), e1.begin(), e1.end());
    want_w.insert(want_w.end(), w1.begin(), w1.end());
  }
  auto dev_scores = logits;
  std::vector<std::int64_t> experts(want_e.size());
  std::vector<float> weights(want_w.size());
  run_each(T, cuda::route_fn{dev_scores.data(), bias.data(), n, k,
                             portable::router_scoring::sqrtsoftplus, 1.0f, true,
                             static_cast<float>(c.routed_scaling_factor), experts.data(),
                             weights.data()});
  CHECK(experts == want_e);
  CHECK(same_bits(weights, want_w));

  // The compressor's pooling (4 groups of ratio 4, 64 channels) and the indexer's scores.
  const std::int64_t groups = 4, r = 4, hd = 64;
  const auto kv = random_values(static_cast<std::size_t>(groups * r * hd), 23);
  const auto gate = random_values(kv.size(), 24, -5, 5);
  std::vector<float> pooled(static_cast<std::size_t>(groups * hd)), want_p(pooled.size());
  for (std::int64_t gi = 0; gi < groups; ++gi)
    for (std::int64_t d = 0; d < hd; ++d)
      want_p[static_cast<std::size_t>(gi * hd + d)] =
          portable::compress_pool_at(kv.data(), gate.data(), r, hd, gi, d);
  run_each(groups * hd, cuda::pool_fn{kv.data(), gate.data(), r, hd, pooled.data()});
  CHECK(same_bits(pooled, want_p));
  const std::int64_t Q = 3, nh = 8, entries = 50;
  const auto dots = random_values(static_cast<std::size_t>(Q * nh * entries), 25, -3, 3);
  const auto hw = random_values(static_cast<std::size_t>(Q * nh), 26);
  std::vector<float> idx(static_cast<std::size_t>(Q * entries)), want_i(idx.size());
  for (std::int64_t qi = 0; qi < Q; ++qi)
    for (std::int64_t e = 0; e < entries; ++e)
      want_i[static_cast<std::size_t>(qi * entries + e)] = portable::index_score(
          dots.data() + qi * nh * entries + e, entries, hw.data() + qi * nh, nh, 0.125f, 0.35f);
  run_each(Q * entries,
           cuda::index_fn{dots.data(), hw.data(), nh, entries, 0.125f, 0.35f, idx.data()});
  CHECK(same_bits(idx, want_i));

  // An FP8 weight of 3 × 2 blocks of 4 × 4 (ragged) and a packed FP4 one, as the loader decodes.
  const std::int64_t rows = 10, cols = 7;
  std::mt19937 gen(27);
  std::vector<std::uint8_t> w8(static_cast<std::size_t>(rows * cols)), s8(6);
  for (auto& b : w8) do b = static_cast<std::uint8_t>(gen()); while ((b & 0x7f) == 0x7f);
  for (auto& b : s8) b = static_cast<std::uint8_t>(120 + gen() % 16);
  std::vector<float> d8(w8.size()), want8(w8.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      want8[static_cast<std::size_t>(i * cols + j)] =
          fp8_e4m3_to_float(w8[static_cast<std::size_t>(i * cols + j)]) *
          fp8_e8m0_to_float(s8[static_cast<std::size_t>((i / 4) * 2 + j / 4)]);
  run_each(rows * cols, cuda::dequant_fn{w8.data(), s8.data(), cols, 4, 4, d8.data()});
  CHECK(same_bits(d8, want8));
  const std::int64_t fc = 64;
  std::vector<std::uint8_t> w4(static_cast<std::size_t>(rows * fc / 2)),
      s4(static_cast<std::size_t>(rows * 2));
  for (auto& b : w4) b = static_cast<std::uint8_t>(gen());
  for (auto& b : s4) b = static_cast<std::uint8_t>(120 + gen() % 16);
  std::vector<float> d4(static_cast<std::size_t>(rows * fc)), want4(d4.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < fc; ++j) {
      const std::size_t e = static_cast<std::size_t>(i * fc + j);
      const std::uint8_t nibble = e % 2 ? w4[e / 2] >> 4 : w4[e / 2] & 0xf;
      want4[e] = fp4_e2m1_to_float(nibble) *
                 fp8_e8m0_to_float(s4[static_cast<std::size_t>(i * 2 + j / 32)]);
    }
  run_each(rows * fc, cuda::dequant_fn{w4.data(), s4.data(), fc, 32, 0, d4.data()});
  CHECK(same_bits(d4, want4));
}

TEST_CASE("emulated: the paged-rows kernel maps each row's selected groups through its pages") {
  // Two sequences' page tables (pages of 3 rows), rows 0-1 of the first and 2-4 of the second,
  // 4 entries a row of which count[r] are selected; the rest must stay as they were.
  const std::int64_t k = 4, rows = 5, per = 3;
  const std::vector<std::int64_t> pages{7, 2, 9, 4, 0, 5};  // sequence 0: 7 2 9; 1: 4 0 5
  const std::vector<std::int64_t> at{0, 0, 3, 3, 3};
  const std::vector<std::int64_t> count{4, 2, 0, 3, 4};
  std::vector<std::int64_t> groups(static_cast<std::size_t>(rows * k));
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i] = static_cast<std::int64_t>(i * 5 % 9);
  std::vector<std::int64_t> out(groups.size(), -1), want(groups.size(), -1);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < count[static_cast<std::size_t>(r)]; ++j) {
      const auto g = groups[static_cast<std::size_t>(r * k + j)];
      want[static_cast<std::size_t>(r * k + j)] =
          pages[static_cast<std::size_t>(at[static_cast<std::size_t>(r)] + g / per)] * per + g % per;
    }
  run_each(rows * k, cuda::paged_rows_fn{groups.data(), count.data(), pages.data(), at.data(), k,
                                         per, out.data()});
  CHECK(out == want);
}

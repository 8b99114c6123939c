// The CUDA kernels whose threads work together (kernels/cuda/block_kernels.cuh), run on the CPU
// under the SIMT emulator (simt.hpp) against the CPU engine: their indexing, barriers, warp
// shuffles and reductions, on every machine. On a device, tests/cuda/ runs them again.
#include "simt.hpp"  // first: the CUDA spellings the kernels' header uses

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu_ops.hpp"
#include "kernels/cuda/block_kernels.cuh"
#include "kernels/ep_dispatch.hpp"
#include "kernels/kv_cache.hpp"
#include "tests/cuda_host/kernel_test_support.hpp"

using namespace troupe::kernels;
namespace simt = troupe::test::simt;
using troupe::test::cpu_query_attention;
using troupe::test::max_abs_diff;
using troupe::test::random_values;
using troupe::test::released_rope;
using troupe::test::window_args;

namespace {

const simt::dim block{cuda::block_threads, 1, 1};

// Runs `check` with the emulator scheduling threads in ascending, then in descending order.
template <class F>
void in_both_orders(F check) {
  for (const auto o : {simt::order::ascending, simt::order::descending}) {
    CAPTURE(o == simt::order::ascending ? "ascending" : "descending");
    simt::thread_order() = o;
    check();
  }
  simt::thread_order() = simt::order::ascending;
}

}  // namespace

TEST_CASE("emulated: the RMSNorm kernel's block reduction matches the CPU's within 1e-6 relative") {
  const std::int64_t rows = 3, n = 5120;  // 20 values per thread, then the warp and block sums
  const auto x0 = random_values(static_cast<std::size_t>(rows * n), 1, -3, 3);
  const auto w = random_values(static_cast<std::size_t>(n), 2, 0.5f, 1.5f);
  auto want = x0;
  for (std::int64_t r = 0; r < rows; ++r) rms_norm(want.data() + r * n, n, w.data(), 1e-6f);
  in_both_orders([&] {
    auto got = x0;
    simt::launch({static_cast<unsigned>(rows)}, block, 0, cuda::rms_norm_kernel, got.data(), n,
                 w.data(), 1e-6f);
    CHECK(max_abs_diff(got, want) <= 1e-6 * 1.5 * 3);
  });
}

TEST_CASE("emulated: attention over window, CSA2 entries and a chunk: the CPU's within 2e-5") {
  // Four queries in one call: two of a sequence whose ring holds positions 0 … 139 and whose
  // chunk starts at 140 (positions 140 and 141), one of a fresh sequence (position 0), and a
  // decode-style query whose own row is already in its ring; compressed rows selected for some.
  const std::int64_t H = 2, hd = 512, win = 128, cap = win + swa_rollback_tokens;
  const rope_table rope = released_rope();
  std::vector<swa_ring> cpu;
  std::vector<float> rings(static_cast<std::size_t>(3 * cap * hd), 0.0f);
  std::vector<std::int64_t> begin;
  const std::vector<std::int64_t> ring_len{140, 0, 300};
  for (std::int64_t s = 0; s < 3; ++s) {
    swa_ring ring(hd, cap);
    for (std::int64_t p = 0; p < ring_len[static_cast<std::size_t>(s)]; ++p) {
      const auto seed = static_cast<std::uint32_t>(100 * s + p);
      const auto row = random_values(static_cast<std::size_t>(hd), seed);
      ring.push(row.data());
    }
    begin.push_back(ring.begin());
    for (std::int64_t p = ring.begin(); p < ring.end(); ++p)
      std::copy_n(ring.at(p), hd, rings.data() + (s * cap + p % cap) * hd);
    cpu.push_back(std::move(ring));
  }
  // Query b: its sequence, position, chunk start and the chunk row of that start.
  const std::vector<std::int64_t> sequence{0, 0, 1, 2}, positions{140, 141, 0, 299},
      chunk_start{140, 140, 0, 300}, chunk_row{0, 0, 2, 3}, n_sel{0, 3, 1, 4};
  const std::int64_t Q = 4, max_sel = 4, n_comp = 9;
  const auto chunk = random_values(static_cast<std::size_t>(3 * hd), 7);
  const auto compressed = random_values(static_cast<std::size_t>(n_comp * hd), 8);
  std::vector<std::int64_t> selected(static_cast<std::size_t>(Q * max_sel), 0);
  for (std::int64_t b = 0; b < Q; ++b)
    for (std::int64_t k = 0; k < n_sel[static_cast<std::size_t>(b)]; ++k)
      selected[static_cast<std::size_t>(b * max_sel + k)] = (b * 5 + k * 2) % n_comp;
  const auto q = random_values(static_cast<std::size_t>(Q * H * hd), 9, -0.2f, 0.2f);
  const auto sinks = random_values(static_cast<std::size_t>(H), 10);
  std::vector<float> got(static_cast<std::size_t>(Q * H * hd), 0.0f), want(got.size());

  auto a = window_args(q.data(), rings.data(), positions.data(), begin.data(), sinks.data(),
                       rope.inv_freq.data(), got.data(), Q, H, cap, win, rope);
  a.compressed = compressed.data();
  a.selected = selected.data();
  a.n_selected = n_sel.data();
  a.max_selected = max_sel;
  a.chunk = chunk.data();
  a.sequence = sequence.data();
  a.chunk_start = chunk_start.data();
  a.chunk_row = chunk_row.data();

  for (std::int64_t b = 0; b < Q; ++b) {
    const auto bi = static_cast<std::size_t>(b);
    cpu_query_attention(q.data() + b * H * hd, H, cpu[static_cast<std::size_t>(sequence[bi])],
                        positions[bi], win, chunk_start[bi], chunk.data() + chunk_row[bi] * hd,
                        compressed.data(), selected.data() + b * max_sel, n_sel[bi],
                        sinks.data(), rope, want.data() + b * H * hd);
  }
  in_both_orders([&] {
    std::fill(got.begin(), got.end(), 0.0f);
    simt::launch({static_cast<unsigned>(Q), static_cast<unsigned>(H)}, block,
                 sizeof(float) * static_cast<std::size_t>(2 * hd + cuda::swa_max_keys),
                 cuda::swa_decode_kernel, a);
    CHECK(max_abs_diff(got, want) <= 2e-5);
  });
}

TEST_CASE("emulated: Engram's gated add kernel equals the CPU's bit for bit") {
  // The gate is one thread's sequential loop (portable::engram_gate), shared with the block
  // through shared memory; with the host's expf the result is the CPU's exactly.
  const std::int64_t T = 2, hc = 4, D = 1024;
  const float eps = 1e-6f;
  const auto streams = random_values(static_cast<std::size_t>(T * hc * D), 11, -2, 2);
  const auto kv = random_values(static_cast<std::size_t>(T * (hc + 1) * D), 12, -2, 2);
  const auto weight = random_values(static_cast<std::size_t>(hc * D), 13, 0, 2);
  auto want = streams;
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t k = 0; k < hc; ++k) {
      float* h = want.data() + (t * hc + k) * D;
      const float* row = kv.data() + t * (hc + 1) * D;
      const float gate = portable::engram_gate(h, row + k * D, weight.data() + k * D, D, eps);
      for (std::int64_t d = 0; d < D; ++d) h[d] = h[d] + gate * row[hc * D + d];
    }
  in_both_orders([&] {
    auto got = streams;
    simt::launch({static_cast<unsigned>(T * hc)}, block, 0, cuda::engram_kernel, got.data(),
                 kv.data(), weight.data(), hc, D, eps);
    CHECK(got == want);
  });
}

TEST_CASE("emulated: the MoE gather and combine kernels equal the host plan's bit for bit") {
  const auto c = troupe::test::make_moe_case(9, 6, 64, 4, 11, 300, 31);
  in_both_orders([&] {
    std::vector<float> g(c.gathered.size()), y(c.combined.size());
    simt::launch({static_cast<unsigned>(c.rows)}, block, 0, cuda::gather_kernel, c.x.data(),
                 c.plan.send_copy.data(), c.k, c.width, g.data());
    simt::launch({static_cast<unsigned>(c.T)}, block, 0, cuda::combine_kernel, c.returned.data(),
                 c.plan.copy_row.data(), c.weights.data(), std::int64_t{c.T}, c.k, c.width,
                 y.data());
    CHECK(g == c.gathered);
    CHECK(y == c.combined);
  });
}

TEST_CASE("emulated: the indexer's top-k kernel picks as the CPU's partial_sort: ties, -inf, +inf") {
  // Rows of few distinct values (many ties), some -inf (dropped), a +inf (a forced candidate
  // block), shorter and longer than the block, and k above the finite entries.
  const std::int64_t rows = 4, n = 700, k = 40;
  std::vector<float> scores(static_cast<std::size_t>(rows * n));
  std::mt19937 gen(9);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t e = 0; e < n; ++e) {
      const auto v = static_cast<int>(gen() % 9);
      scores[static_cast<std::size_t>(r * n + e)] = v == 0 ? -INFINITY : 0.25f * static_cast<float>(v);
    }
  scores[static_cast<std::size_t>(n + 650)] = INFINITY;
  for (std::int64_t e = 30; e < n; ++e) scores[static_cast<std::size_t>(3 * n + e)] = -INFINITY;
  const std::vector<std::int64_t> offset{0, 1000, 2000, 3000};
  // The CPU model's top_finite: the first k by (score desc, index asc), then -inf dropped.
  std::vector<std::vector<std::int64_t>> want(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const float* row = scores.data() + r * n;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](auto a, auto b) {
      return row[a] != row[b] ? row[a] > row[b] : a < b;
    });
    for (std::int64_t j = 0; j < k; ++j)
      if (row[idx[static_cast<std::size_t>(j)]] != -INFINITY)
        want[static_cast<std::size_t>(r)].push_back(idx[static_cast<std::size_t>(j)] + offset[static_cast<std::size_t>(r)]);
  }
  REQUIRE(want[3].size() < static_cast<std::size_t>(k));  // a row with fewer finite entries than k
  in_both_orders([&] {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(rows * k), -1), count(rows, -1);
    simt::launch({static_cast<unsigned>(rows)}, block, 0, cuda::top_k_kernel, scores.data(), n, k,
                 offset.data(), idx.data(), count.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      CAPTURE(r);
      const auto& w = want[static_cast<std::size_t>(r)];
      REQUIRE(count[static_cast<std::size_t>(r)] == static_cast<std::int64_t>(w.size()));
      CHECK(std::equal(w.begin(), w.end(), idx.begin() + r * k));
    }
  });
}

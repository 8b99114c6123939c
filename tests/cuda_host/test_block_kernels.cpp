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

// Runs `check` with the emulator scheduling threads in ascending, then in descending order,
// then warp by warp.
template <class F>
void in_each_order(F check) {
  for (const auto o : {simt::order::ascending, simt::order::descending, simt::order::warp_by_warp}) {
    CAPTURE(o == simt::order::ascending ? "ascending"
                                         : o == simt::order::descending ? "descending" : "warp by warp");
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
  in_each_order([&] {
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
  in_each_order([&] {
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
  in_each_order([&] {
    auto got = streams;
    simt::launch({static_cast<unsigned>(T * hc)}, block, 0, cuda::engram_kernel, got.data(),
                 kv.data(), weight.data(), hc, D, eps);
    CHECK(got == want);
  });
}

TEST_CASE("emulated: the MoE gather and combine kernels equal the host plan's bit for bit") {
  const auto c = troupe::test::make_moe_case(9, 6, 64, 4, 11, 300, 31);
  in_each_order([&] {
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

namespace {

// The CPU model's top_finite for each row of scores [rows, n]: the first k by (score desc,
// index asc), -inf dropped, each index plus offset[row].
std::vector<std::vector<std::int64_t>> cpu_top_k(const std::vector<float>& scores, std::int64_t rows,
                                                 std::int64_t n, std::int64_t k,
                                                 const std::vector<std::int64_t>& offset) {
  std::vector<std::vector<std::int64_t>> want(static_cast<std::size_t>(rows));
  const std::int64_t kk = std::min(k, n);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const float* row = scores.data() + r * n;
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](auto a, auto b) {
      return row[a] != row[b] ? row[a] > row[b] : a < b;
    });
    for (std::int64_t j = 0; j < kk; ++j)
      if (row[idx[static_cast<std::size_t>(j)]] != -INFINITY)
        want[static_cast<std::size_t>(r)].push_back(idx[static_cast<std::size_t>(j)] +
                                                    (offset.empty() ? 0 : offset[static_cast<std::size_t>(r)]));
  }
  return want;
}

// Runs `select(idx, count)` in both thread orders and checks each row against cpu_top_k.
template <class F>
void check_top_k(const std::vector<float>& scores, std::int64_t rows, std::int64_t n,
                 std::int64_t k, const std::vector<std::int64_t>& offset, F select) {
  const auto want = cpu_top_k(scores, rows, n, k, offset);
  in_each_order([&] {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(rows * k), -1), count(static_cast<std::size_t>(rows), -1);
    select(idx.data(), count.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      CAPTURE(r);
      const auto& w = want[static_cast<std::size_t>(r)];
      REQUIRE(count[static_cast<std::size_t>(r)] == static_cast<std::int64_t>(w.size()));
      CHECK(std::equal(w.begin(), w.end(), idx.begin() + r * k));
    }
  });
}

// Rows of few distinct values (many ties), some -inf (dropped), a +inf (a forced candidate
// block), and a row with fewer entries above -inf than k.
std::vector<float> tied_scores(std::int64_t rows, std::int64_t n, unsigned seed) {
  std::vector<float> scores(static_cast<std::size_t>(rows * n));
  std::mt19937 gen(seed);
  for (auto& s : scores) {
    const auto v = static_cast<int>(gen() % 9);
    s = v == 0 ? -INFINITY : 0.25f * static_cast<float>(v) - 1.0f;
  }
  scores[static_cast<std::size_t>(n + n - 50)] = INFINITY;
  for (std::int64_t e = 30; e < n; ++e) scores[static_cast<std::size_t>((rows - 1) * n + e)] = -INFINITY;
  return scores;
}

}  // namespace

TEST_CASE("emulated: the indexer's k-pass top-k kernel picks as the CPU's partial_sort: ties, -inf, +inf") {
  const std::int64_t rows = 4, n = 700, k = 40;
  const auto scores = tied_scores(rows, n, 9);
  const std::vector<std::int64_t> offset{0, 1000, 2000, 3000};
  check_top_k(scores, rows, n, k, offset, [&](std::int64_t* idx, std::int64_t* count) {
    simt::launch({static_cast<unsigned>(rows)}, block, 0, cuda::top_k_kernel, scores.data(), n, k,
                 offset.data(), idx, count);
  });
}

TEST_CASE("emulated: the indexer's radix-select top-k kernel picks as the CPU's partial_sort") {
  auto radix = [](const std::vector<float>& scores, std::int64_t rows, std::int64_t n,
                  std::int64_t k, const std::vector<std::int64_t>& offset) {
    REQUIRE(std::min(k, n) <= cuda::radix_max_k);  // top_k_rows would take the radix kernel
    std::size_t sorted = 1;  // its shared memory: a power of two of 8-byte picks
    while (static_cast<std::int64_t>(sorted) < std::min(k, n)) sorted <<= 1;
    check_top_k(scores, rows, n, k, offset, [&](std::int64_t* idx, std::int64_t* count) {
      simt::launch({static_cast<unsigned>(rows)}, block, sorted * sizeof(std::uint64_t),
                   cuda::top_k_radix_kernel, scores.data(), n, k,
                   offset.empty() ? nullptr : offset.data(), idx, count);
    });
  };
  SUBCASE("ties cut at the k-th entry, -inf, +inf, fewer entries than k") {
    radix(tied_scores(4, 700, 9), 4, 700, 40, {0, 1000, 2000, 3000});
  }
  SUBCASE("V4.1's shapes: 512 of 3,000 distinct scores, 2,048 of 5,000 blocks of few values") {
    const auto distinct = random_values(2 * 3000, 5, -40, 40);
    radix(distinct, 2, 3000, 512, {});
    radix(tied_scores(2, 5000, 11), 2, 5000, 2048, {7, 9});
  }
  SUBCASE("signs, -0 tied with +0 (in row order across chunks), subnormals, the largest floats") {
    std::vector<float> row(1500, 0.0f);
    for (std::size_t e = 0; e < row.size(); e += 3) row[e] = -0.0f;
    row[10] = -1e-40f, row[20] = 1e-40f, row[30] = -3.4e38f, row[40] = 3.4e38f;
    row[50] = -INFINITY, row[60] = INFINITY, row[70] = -2.5f, row[80] = 2.5f;
    radix(row, 1, 1500, 700, {});
    radix(row, 1, 1500, 3, {});
  }
  SUBCASE("k of 0, k above n, a row of -inf only") {
    std::vector<float> rows(3 * 20);
    std::iota(rows.begin(), rows.end(), -30.0f);
    std::fill(rows.begin() + 20, rows.begin() + 40, -INFINITY);
    radix(rows, 3, 20, 0, {});
    radix(rows, 3, 20, 50, {});
  }
}

TEST_CASE("emulated: project_rows' tiles sum each output's products in ascending order, each "
          "row alone") {
  // Partial tiles in both directions, a k that is not whole slabs, row strides wider than k.
  const std::int64_t m = 70, n = 131, k = 37, ldx = 40, ldw = 45, ldy = 140;
  const auto x = random_values(static_cast<std::size_t>(m * ldx), 21, -2, 2);
  const auto w = random_values(static_cast<std::size_t>(n * ldw), 22, -2, 2);
  std::vector<float> want(static_cast<std::size_t>(m * ldy), -7.0f);
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      float acc = 0.0f;
      for (std::int64_t j = 0; j < k; ++j)
        acc = __fadd_rn(acc, __fmul_rn(x[static_cast<std::size_t>(r * ldx + j)],
                                       w[static_cast<std::size_t>(c * ldw + j)]));
      want[static_cast<std::size_t>(r * ldy + c)] = acc;
    }
  auto project = [&](const float* rows, std::int64_t count, float* y) {
    const simt::dim grid(static_cast<unsigned>((n + cuda::project_tile - 1) / cuda::project_tile),
                         static_cast<unsigned>((count + cuda::project_tile - 1) / cuda::project_tile));
    simt::launch(grid, block, 0, cuda::project_tiled_kernel, rows, ldx, w.data(), ldw, y, ldy,
                 count, n, k);
  };
  in_each_order([&] {
    std::vector<float> y(static_cast<std::size_t>(m * ldy), -7.0f);  // the stride's gaps kept
    project(x.data(), m, y.data());
    CHECK(y == want);
    // Row 66 (the second tile of rows) alone: the same bits.
    std::vector<float> alone(static_cast<std::size_t>(ldy), -7.0f);
    project(x.data() + 66 * ldx, 1, alone.data());
    CHECK(std::equal(alone.begin(), alone.end(), want.begin() + 66 * ldy));
  });
}

namespace {
// A barrier that thread 0 skips: the others wait for it for ever.
__global__ void skips_barrier_kernel(int* out) {
  if (threadIdx.x != 0) __syncthreads();
  out[threadIdx.x] = 1;
}
}  // namespace

TEST_CASE("emulated: a barrier some threads never reach is reported, in every order") {
  std::vector<int> out(block.x, 0);
  in_each_order([&] {
    CHECK_THROWS_WITH_AS(simt::launch({1}, block, 0, skips_barrier_kernel, out.data()),
                         "simt::launch: the block's threads wait for each other",
                         std::logic_error);
  });
}

// The CPU model's building blocks on hand-computed cases: the e4m3 / e2m1 quantisers, the
// interleaved partial RoPE, the mHC Sinkhorn mixing, MoE routing, NumPy's generator that
// the Engram hash multipliers come from, the batch-invariant GEMM and the worker pool.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu_ops.hpp"
#include "kernels/engram_hash.hpp"
#include "kernels/portable_math.hpp"
#include "kernels/worker_pool.hpp"

using namespace troupe::kernels;

// tests/kernels/blas_kernel.sh runs this suite under each OpenBLAS kernel the CPU can execute;
// that means something only if OpenBLAS really switched.
TEST_CASE("the BLAS kernel is the one OPENBLAS_CORETYPE asks for") {
  const std::string name = blas_kernel_name();
  MESSAGE("OpenBLAS kernel: " << name);
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (asked == nullptr || *asked == '\0') return;
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
  };
  CHECK(lower(name) == lower(asked));
}

TEST_CASE("round_to_e4m3 rounds to the nearest e4m3 value, ties to even") {
  CHECK(round_to_e4m3(0.3f) == 0.3125f);   // step 2^-5 at [0.25, 0.5): 9.6 steps -> 10
  CHECK(round_to_e4m3(1.0625f) == 1.0f);   // halfway between 1 and 1.125: even mantissa
  CHECK(round_to_e4m3(1.1875f) == 1.25f);  // halfway between 1.125 and 1.25: even
  CHECK(round_to_e4m3(-448.0f) == -448.0f);
  CHECK(round_to_e4m3(0x1p-9f) == 0x1p-9f);          // smallest subnormal
  CHECK(round_to_e4m3(0x1p-11f) == 0.0f);            // a quarter step rounds to zero
  CHECK(round_to_e4m3(3.0f * 0x1p-10f) == 0x1p-8f);  // 1.5 subnormal steps -> 2 (even)
  CHECK(round_to_e4m3(15.5f) == 16.0f);              // mantissa carry into the next binade
}

TEST_CASE("FP4 block quantiser: power-of-two scale and the e2m1 tie rules") {
  // amax 6 → scale 1: the values sit on the grid's tie points.
  std::vector<float> v(32, 0.0f);
  const float in[] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.75f, 0.3f};
  const float want[] = {6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -1.0f, 0.5f};
  std::copy(std::begin(in), std::end(in), v.begin());
  fake_quant_fp4_block(v.data(), 32, 32, false);
  for (std::size_t i = 0; i < std::size(want); ++i) CHECK(v[i] == want[i]);

  // amax 3 → ue8m0 scale 2^ceil(log2(0.5)) = 0.5: 3 / 0.5 = 6 stays 6, 1.1 / 0.5 = 2.2 → 2.
  std::vector<float> w(32, 0.0f);
  w[0] = 3.0f;
  w[1] = 1.1f;
  fake_quant_fp4_block(w.data(), 32, 32, false);
  CHECK(w[0] == 3.0f);
  CHECK(w[1] == 1.0f);

  // e4m3 scales: amax 1 → scale e4m3(1/6) = 0.171875; 1 / 0.171875 = 5.82 → 6 → 1.03125.
  std::vector<float> e(16, 0.0f);
  e[0] = 1.0f;
  fake_quant_fp4_block(e.data(), 16, 16, true);
  CHECK(e[0] == doctest::Approx(6.0f * 0.171875f));

  // A length the block does not divide is left as is (tiny configs).
  std::vector<float> odd = {0.3f, 0.7f, 1.9f};
  fake_quant_fp4_block(odd.data(), 3, 32, false);
  CHECK(odd[0] == 0.3f);
}

TEST_CASE("FP8 block quantiser keeps every value on its block's e4m3 grid") {
  std::vector<float> v(64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i)) * (i < 32 ? 3.0f : 0.01f);
  auto orig = v;
  fake_quant_fp8_block32(v.data(), 64);
  for (std::size_t b = 0; b < 2; ++b) {
    float amax = 0;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(orig[b * 32 + i]));
    const float scale = std::exp2(std::ceil(std::log2(amax / 448.0f)));
    for (std::size_t i = 0; i < 32; ++i) {
      const float q = v[b * 32 + i] / scale;
      CHECK(round_to_e4m3(q) == q);
      CHECK(std::fabs(v[b * 32 + i] - orig[b * 32 + i]) <=
            std::fabs(orig[b * 32 + i]) / 16 + 1e-12f);
    }
  }
}

TEST_CASE("RoPE rotates adjacent pairs of the trailing slice; the inverse undoes it") {
  rope_parameters p;
  p.rope_theta = 10000.0;
  p.partial_rotary_factor = 0.5;  // 4 of 8 channels rotated
  auto t = make_rope_table(p, 8);
  REQUIRE(t.rope_dim == 4);
  REQUIRE(t.inv_freq.size() == 2);
  CHECK(t.inv_freq[0] == 1.0f);
  CHECK(t.inv_freq[1] == doctest::Approx(0.01f));  // 10000^(-2/4)
  std::vector<float> v = {1, 2, 3, 4, 1, 0, 0, 1};
  auto orig = v;
  apply_rope(v.data(), 8, t, 3);
  for (int i = 0; i < 4; ++i) CHECK(v[i] == orig[i]);  // the nope channels pass through
  const float a0 = 3.0f, a1 = 0.03f;
  CHECK(v[4] == doctest::Approx(std::cos(a0)));  // (1, 0) rotated by 3 rad
  CHECK(v[5] == doctest::Approx(std::sin(a0)));
  CHECK(v[6] == doctest::Approx(-std::sin(a1)));  // (0, 1) rotated by 0.03 rad
  CHECK(v[7] == doctest::Approx(std::cos(a1)));
  apply_rope(v.data(), 8, t, 3, /*inverse=*/true);
  for (int i = 0; i < 8; ++i) CHECK(v[i] == doctest::Approx(orig[i]).epsilon(1e-6));
}

TEST_CASE("YaRN keeps high frequencies, divides low ones by the factor") {
  rope_parameters p;
  p.rope_type = "yarn";
  p.rope_theta = 160000.0;
  p.partial_rotary_factor = 1.0;
  p.factor = 4;
  p.original_max_position_embeddings = 256;
  auto t = make_rope_table(p, 64);
  rope_parameters plain = p;
  plain.rope_type = "default";
  auto d = make_rope_table(plain, 64);
  CHECK(t.inv_freq.front() == d.inv_freq.front());
  CHECK(t.inv_freq.back() == doctest::Approx(d.inv_freq.back() / 4));
}

TEST_CASE("Sinkhorn mixing is close to doubly stochastic") {
  std::vector<float> m = {3.0f,  -1.0f, 0.5f, 2.0f, 0.0f, 0.0f, 1.0f, -2.0f,
                          -3.0f, 4.0f,  0.1f, 0.2f, 1.0f, 1.0f, 1.0f, 1.0f};
  portable::sinkhorn(m.data(), 4, 20, 1e-6f);
  for (int j = 0; j < 4; ++j) {
    float row = 0, col = 0;
    for (int k = 0; k < 4; ++k) {
      CHECK(m[j * 4 + k] > 0.0f);
      row += m[j * 4 + k];
      col += m[k * 4 + j];
    }
    CHECK(row == doctest::Approx(1.0f).epsilon(1e-3));
    CHECK(col == doctest::Approx(1.0f).epsilon(1e-5));  // the last pass normalises columns
  }
}

TEST_CASE("MoE routing: the bias picks the experts, the unbiased scores weigh them") {
  text_config c;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.scoring_func = "sqrtsoftplus";
  c.gate_temp = 2.0;
  c.routed_scaling_factor = 1.5;
  std::vector<float> logits = {4.0f, 2.0f, 0.0f, -2.0f};
  std::vector<float> bias = {0.0f, 0.0f, 5.0f, 0.0f};  // steers expert 2 in
  std::vector<std::int64_t> experts;
  std::vector<float> weights;
  route_token(c, logits.data(), bias.data(), experts, weights);
  REQUIRE(experts == std::vector<std::int64_t>{2, 0});
  const double s0 = std::sqrt(std::log1p(std::exp(2.0))), s2 = std::sqrt(std::log(2.0));
  CHECK(weights[0] == doctest::Approx(1.5 * s2 / (s0 + s2)));
  CHECK(weights[1] == doctest::Approx(1.5 * s0 / (s0 + s2)));
}

TEST_CASE("MoE routing: the top k of a full sort by score + bias, ties to the lower expert") {
  // The released shape (384 experts, top 6) under each scoring function, against the order a
  // full sort gives; logits with ties, some broken by the bias and some not.
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-4, 4);
  for (const char* func : {"sqrtsoftplus", "sigmoid", "softmax"}) {
    CAPTURE(func);
    text_config c;
    c.n_routed_experts = 384;
    c.num_experts_per_tok = 6;
    c.scoring_func = func;
    for (int t = 0; t < 50; ++t) {
      std::vector<float> logits(384), bias(384, 0.0f);
      for (auto& v : logits) v = u(g);
      for (int e = 0; e < 8; ++e) logits[static_cast<std::size_t>(e * 40)] = 3.9f;  // ties
      for (int e = 0; e < 384; e += 3) bias[static_cast<std::size_t>(e)] = u(g) / 40;
      auto scores = logits;
      std::vector<std::int64_t> experts;
      std::vector<float> weights;
      route_token(c, scores.data(), bias.data(), experts, weights);
      std::vector<std::int64_t> order(384);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        const float sa = scores[static_cast<std::size_t>(a)] + bias[static_cast<std::size_t>(a)];
        const float sb = scores[static_cast<std::size_t>(b)] + bias[static_cast<std::size_t>(b)];
        return sa != sb ? sa > sb : a < b;
      });
      order.resize(6);
      CHECK(experts == order);
      CHECK(std::accumulate(weights.begin(), weights.end(), 0.0) ==
            doctest::Approx(c.routed_scaling_factor).epsilon(1e-5));
    }
  }
}

TEST_CASE("numpy_rng reproduces NumPy's default_rng integers") {
  // Values printed by NumPy 2.4.6: default_rng(10007).integers(0, 23058430092136939, 3) and
  // default_rng(0).integers(0, 2**40, 2).
  numpy_rng a(10007);
  CHECK(a.integers(23058430092136939) == 18984069153536582);
  CHECK(a.integers(23058430092136939) == 1198982504596558);
  CHECK(a.integers(23058430092136939) == 8908289623672409);
  numpy_rng b(0);
  CHECK(b.integers(std::int64_t(1) << 40) == 700346781657);
  CHECK(b.integers(std::int64_t(1) << 40) == 296633628802);
}

TEST_CASE("the released model's Engram hash multipliers equal the reference's") {
  // tests/kernels/golden/model/engram-v41-flash.json: the multipliers the reference derives for
  // the released config (layers 1 and 14, 4-grams, compressed vocabulary 99,092).
  const auto root = std::filesystem::path(TROUPE_SOURCE_DIR);
  auto cfg = load_model_config(root / "examples/models/DeepSeek-V4.1-Flash/config.json");
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  std::ifstream f(root / "tests/kernels/golden/model/engram-v41-flash.json");
  const auto j = nlohmann::json::parse(f);
  REQUIRE(cfg->text.engram_compressed_vocab_size ==
          j.at("compressed_vocab_size").get<std::int64_t>());
  const auto layout = engram_hash_layout::from_config(cfg->text);
  REQUIRE(layout.multipliers.size() == 2);
  for (std::size_t l = 0; l < 2; ++l) {
    std::vector<std::int64_t> want;
    for (const auto& s : j.at("multipliers").at(l))
      want.push_back(std::stoll(s.get<std::string>()));
    CHECK(layout.multipliers[l] == want);
  }
}

namespace {

// Deterministic values in [-1, 1) from a counter (no dependence on a library's generator).
std::vector<float> ramp_values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  std::uint32_t z = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    z = z * 1664525u + 1013904223u;
    x = static_cast<float>(z >> 8) * 0x1p-23f - 1.0f;
  }
  return v;
}

std::vector<gemm_isa> runnable_isas() {
  std::vector<gemm_isa> isas{gemm_isa::generic};
  if (best_gemm_isa() != gemm_isa::generic) isas.push_back(best_gemm_isa());
  return isas;
}

}  // namespace

TEST_CASE("gemm_nt_invariant: each row's result is bitwise the same alone, in any batch and any column split") {
  // in = 67: eight-wide chunks plus a 3-element tail; out = 13: 4-column tiles plus a remainder.
  for (const std::int64_t in : {std::int64_t{67}, std::int64_t{8}, std::int64_t{5}}) {
    const std::int64_t out = 13, rows = 7, ldx = in + 3, ldy = out + 2;
    const auto x = ramp_values(static_cast<std::size_t>(rows * ldx), 1);
    const auto w = ramp_values(static_cast<std::size_t>(out * in), 2);
    for (gemm_isa isa : runnable_isas()) {
      CAPTURE(in);
      CAPTURE(static_cast<int>(isa));
      std::vector<float> batch(static_cast<std::size_t>(rows * ldy), -7.0f);
      gemm_nt_invariant(x.data(), rows, in, ldx, w.data(), 0, out, batch.data(), ldy, isa);
      for (std::int64_t r = 0; r < rows; ++r) {
        // The row alone, its columns in three uneven calls.
        std::vector<float> alone(static_cast<std::size_t>(out), -9.0f);
        const float* xr = x.data() + r * ldx;
        gemm_nt_invariant(xr, 1, in, ldx, w.data(), 0, 1, alone.data(), out, isa);
        gemm_nt_invariant(xr, 1, in, ldx, w.data(), 1, 6, alone.data(), out, isa);
        gemm_nt_invariant(xr, 1, in, ldx, w.data(), 6, out, alone.data(), out, isa);
        for (std::int64_t c = 0; c < out; ++c) {
          CHECK(batch[static_cast<std::size_t>(r * ldy + c)] == alone[static_cast<std::size_t>(c)]);
          double exact = 0.0;
          for (std::int64_t k = 0; k < in; ++k)
            exact += double(xr[k]) * double(w[static_cast<std::size_t>(c * in + k)]);
          CHECK(alone[static_cast<std::size_t>(c)] == doctest::Approx(exact).epsilon(1e-5));
        }
        // The columns left of y's stride untouched.
        CHECK(batch[static_cast<std::size_t>(r * ldy + out)] == -7.0f);
      }
    }
  }
}

TEST_CASE("gemm_nt_invariant sums a row's lanes in the documented order") {
  // 16 products: lanes l hold x[l] w[l] + x[l + 8] w[l + 8]; with values chosen so that a
  // different association loses or keeps the small terms, the result pins the order.
  std::vector<float> x(16, 1.0f), w(16, 0.0f);
  w[0] = 0x1p24f;   // lane 0: 2^24
  w[4] = 1.0f;      // lane 4: 1 — (l0 + l4) rounds to 2^24 (ties to even)
  w[2] = 1.0f;      // lane 2: 1
  w[6] = 1.0f;      // lane 6: 1 — (l2 + l6) = 2, then 2^24 + 2 is exact
  w[1] = -0x1p24f;  // lane 1 against lane 0 only in the last addition
  for (gemm_isa isa : runnable_isas()) {
    float y = 0.0f;
    gemm_nt_invariant(x.data(), 1, 16, 16, w.data(), 0, 1, &y, 1, isa);
    CHECK(y == 2.0f);
  }
}

TEST_CASE("worker_pool runs every part once, on as many threads as it has, nested calls inline") {
  worker_pool pool(3);
  CHECK(pool.size() == 3);
  for (int round = 0; round < 200; ++round) {  // back to back: workers spinning and asleep
    std::vector<std::atomic<int>> hits(5);
    std::vector<std::thread::id> who(5);
    pool.run(5, [&](int part) {  // capped at 3 parts
      hits[static_cast<std::size_t>(part)]++;
      who[static_cast<std::size_t>(part)] = std::this_thread::get_id();
    });
    CHECK(hits[0] == 1);
    CHECK(hits[1] == 1);
    CHECK(hits[2] == 1);
    CHECK(hits[3] == 0);
    CHECK(who[0] == std::this_thread::get_id());
    CHECK(who[1] != who[0]);
    CHECK(who[2] != who[1]);
    if (round % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // A section that runs another: the inner one runs on the thread that asked for it.
  std::atomic<int> inner{0};
  pool.run(2, [&](int) {
    const auto me = std::this_thread::get_id();
    pool.run(3, [&](int) {
      CHECK(std::this_thread::get_id() == me);
      inner++;
    });
  });
  CHECK(inner == 6);
  // Two threads sharing the pool: each call still runs all its parts.
  std::atomic<int> total{0};
  std::thread other([&] {
    for (int i = 0; i < 100; ++i) pool.run(3, [&](int) { total++; });
  });
  for (int i = 0; i < 100; ++i) pool.run(3, [&](int) { total++; });
  other.join();
  CHECK(total == 600);
}

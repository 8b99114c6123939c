// Sampling: each rule (greedy, temperature, top-k, top-p, min-p) on hand-checkable logits, the
// draw frequencies against the distribution, determinism per (seed, position), independence of
// a row from the rest of its batch, and refused parameters / logits.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <vector>

#include "kernels/sampling.hpp"

using namespace troupe::kernels;

namespace {

// Logits whose softmax is exactly probs (up to rounding).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(p > 0 ? float(std::log(p)) : -INFINITY);
  return out;
}

// How often each token is drawn over positions 0..n-1 with params.
std::vector<double> frequencies(const std::vector<float>& logits, const sampling_params& params, int n) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < n; ++i) {
    auto t = sample_token(logits, params, std::uint64_t(i));
    REQUIRE(t.ok());
    f[std::size_t(*t)] += 1.0 / n;
  }
  return f;
}

const std::vector<double> four = {0.5, 0.3, 0.15, 0.05};

}  // namespace

TEST_CASE("sampling: counter_uniform depends only on (seed, position) and is uniform") {
  CHECK(counter_uniform(7, 3) == counter_uniform(7, 3));
  CHECK(counter_uniform(7, 3) != counter_uniform(7, 4));
  CHECK(counter_uniform(7, 3) != counter_uniform(8, 3));
  double sum = 0;
  int bins[10] = {};
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = counter_uniform(42, std::uint64_t(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
    ++bins[int(u * 10)];
  }
  CHECK(sum / n == doctest::Approx(0.5).epsilon(0.01));
  for (int b : bins) CHECK(std::abs(b - n / 10) < n / 100);
}

TEST_CASE("sampling: greedy takes the argmax, the lowest id on ties; temperature 0 is greedy") {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  sampling_params g;
  g.greedy = true;
  for (std::uint64_t pos = 0; pos < 20; ++pos) CHECK(*sample_token(l, g, pos) == 1);
  sampling_params t0;
  t0.temperature = 0.0;
  CHECK(*sample_token(l, t0, 5) == 1);
  const auto d = sampling_distribution(l, g);
  CHECK((*d)[1] == 1.0);
  CHECK((*d)[3] == 0.0);
}

TEST_CASE("sampling: temperature 1 draws by the softmax; temperature 2 flattens it") {
  const auto l = logits_of(four);
  sampling_params p;
  p.seed = 11;
  const auto d = *sampling_distribution(l, p);
  for (std::size_t i = 0; i < four.size(); ++i) CHECK(d[i] == doctest::Approx(four[i]).epsilon(1e-6));
  const auto f = frequencies(l, p, 40000);
  for (std::size_t i = 0; i < four.size(); ++i) CHECK(std::abs(f[i] - four[i]) < 0.01);
  p.temperature = 2.0;  // p_i ~ sqrt(four_i)
  const auto d2 = *sampling_distribution(l, p);
  double z = 0;
  for (double q : four) z += std::sqrt(q);
  for (std::size_t i = 0; i < four.size(); ++i) CHECK(d2[i] == doctest::Approx(std::sqrt(four[i]) / z).epsilon(1e-6));
  const auto f2 = frequencies(l, p, 40000);
  for (std::size_t i = 0; i < four.size(); ++i) CHECK(std::abs(f2[i] - d2[i]) < 0.01);
}

TEST_CASE("sampling: top-k keeps the k most likely tokens, renormalised") {
  const auto l = logits_of(four);
  sampling_params p;
  p.top_k = 2;
  const auto d = *sampling_distribution(l, p);
  CHECK(d[0] == doctest::Approx(0.5 / 0.8));
  CHECK(d[1] == doctest::Approx(0.3 / 0.8));
  CHECK(d[2] == 0.0);
  CHECK(d[3] == 0.0);
  const auto f = frequencies(l, p, 20000);
  CHECK(f[2] == 0.0);
  CHECK(f[3] == 0.0);
  CHECK(std::abs(f[0] - 0.625) < 0.015);
  p.top_k = 1;  // k = 1 is greedy
  for (std::uint64_t pos = 0; pos < 50; ++pos) CHECK(*sample_token(l, p, pos) == 0);
}

TEST_CASE("sampling: top-p keeps the smallest most-likely set reaching p") {
  const auto l = logits_of(four);
  sampling_params p;
  p.top_p = 0.8;  // 0.5 < 0.8, 0.5 + 0.3 reaches it: two tokens
  auto d = *sampling_distribution(l, p);
  CHECK(d[0] == doctest::Approx(0.625));
  CHECK(d[1] == doctest::Approx(0.375));
  CHECK(d[2] == 0.0);
  p.top_p = 0.81;  // needs the third token too
  d = *sampling_distribution(l, p);
  CHECK(d[2] == doctest::Approx(0.15 / 0.95));
  CHECK(d[3] == 0.0);
  p.top_p = 0.1;  // the first token alone already reaches it
  d = *sampling_distribution(l, p);
  CHECK(d[0] == 1.0);
  const auto f = frequencies(l, sampling_params{.top_p = 0.8}, 20000);
  CHECK(f[2] == 0.0);
  CHECK(std::abs(f[0] - 0.625) < 0.015);
}

TEST_CASE("sampling: min-p keeps tokens at least min_p times as likely as the top one") {
  const auto l = logits_of(four);
  sampling_params p;
  p.min_p = 0.5;  // floor 0.25: tokens 0 and 1
  auto d = *sampling_distribution(l, p);
  CHECK(d[0] == doctest::Approx(0.625));
  CHECK(d[1] == doctest::Approx(0.375));
  CHECK(d[2] == 0.0);
  p.min_p = 0.29;  // floor 0.145: token 2 (0.15) stays, token 3 (0.05) goes
  d = *sampling_distribution(l, p);
  CHECK(d[2] > 0.0);
  CHECK(d[3] == 0.0);
  p.min_p = 1.0;
  d = *sampling_distribution(l, p);
  CHECK(d[0] == 1.0);
}

TEST_CASE("sampling: the rules compose in order (temperature, top-k, top-p, min-p)") {
  const auto l = logits_of({0.4, 0.3, 0.2, 0.1});
  sampling_params p;
  p.top_k = 3;   // 0.4 0.3 0.2 -> 4/9 3/9 2/9
  p.top_p = 0.7; // 4/9 = 0.44 < 0.7, 7/9 = 0.78 reaches: two tokens
  const auto d = *sampling_distribution(l, p);
  CHECK(d[0] == doctest::Approx(4.0 / 7));
  CHECK(d[1] == doctest::Approx(3.0 / 7));
  CHECK(d[2] == 0.0);
}

TEST_CASE("sampling: a request's draws depend on its seed and position only") {
  std::vector<float> l(50);
  for (std::size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i)) * 2);
  sampling_params a;
  a.seed = 1234;
  a.temperature = 0.8;
  a.top_p = 0.95;
  std::vector<std::int64_t> first, again, other;
  sampling_params b = a;
  b.seed = 1235;
  for (std::uint64_t pos = 100; pos < 164; ++pos) {
    first.push_back(*sample_token(l, a, pos));
    other.push_back(*sample_token(l, b, pos));
  }
  for (std::uint64_t pos = 163; pos + 1 > 100; --pos) again.insert(again.begin(), *sample_token(l, a, pos));
  CHECK(first == again);  // order of calls does not matter
  CHECK(first != other);
}

TEST_CASE("sampling: a row of a batch is drawn as it would be alone, whatever the batch holds") {
  const std::int64_t V = 32;
  std::vector<float> mine(V);
  for (std::int64_t i = 0; i < V; ++i) mine[std::size_t(i)] = float(std::cos(double(i) * 0.7) * 3);
  sampling_params me;
  me.seed = 99;
  me.temperature = 1.3;
  me.top_k = 10;
  me.min_p = 0.05;
  for (std::uint64_t pos = 0; pos < 40; ++pos) {
    const auto alone = *sample_token(mine, me, pos);
    for (int others = 0; others < 4; ++others) {
      std::vector<float> batch;
      std::vector<sampling_params> params;
      std::vector<std::uint64_t> positions;
      for (int r = 0; r <= others; ++r) {  // my row last, after `others` unrelated rows
        if (r == others) {
          batch.insert(batch.end(), mine.begin(), mine.end());
          params.push_back(me);
          positions.push_back(pos);
        } else {
          for (std::int64_t i = 0; i < V; ++i) batch.push_back(float((r + 1) * i % 7));
          params.push_back(sampling_params{.temperature = 0.5, .seed = std::uint64_t(r)});
          positions.push_back(pos * 3 + std::uint64_t(r));
        }
      }
      auto drawn = sample_batch(batch, V, params, positions);
      REQUIRE(drawn.ok());
      CHECK(drawn->back() == alone);
    }
  }
}

TEST_CASE("sampling: invalid parameters and logits are refused with a reason") {
  const std::vector<float> l = {1.0f, 2.0f};
  CHECK(sample_token(l, sampling_params{.temperature = -1}, 0).error().find("temperature") != std::string::npos);
  CHECK(sample_token(l, sampling_params{.top_k = -2}, 0).error().find("top_k") != std::string::npos);
  CHECK(sample_token(l, sampling_params{.top_p = 0.0}, 0).error().find("top_p") != std::string::npos);
  CHECK(sample_token(l, sampling_params{.top_p = 1.5}, 0).error().find("top_p") != std::string::npos);
  CHECK(sample_token(l, sampling_params{.min_p = 2.0}, 0).error().find("min_p") != std::string::npos);
  CHECK(sample_token(std::vector<float>{}, sampling_params{}, 0).error().find("empty") != std::string::npos);
  CHECK(sample_token(std::vector<float>{1.0f, NAN}, sampling_params{}, 0).error().find("NaN") != std::string::npos);
  CHECK(sample_token(std::vector<float>{-INFINITY, -INFINITY}, sampling_params{}, 0).error().find("-inf") != std::string::npos);
  // -inf logits (masked tokens) are never drawn
  const std::vector<float> masked = {-INFINITY, 0.0f, -INFINITY, 0.0f};
  for (std::uint64_t pos = 0; pos < 200; ++pos) {
    const auto t = *sample_token(masked, sampling_params{.seed = 5}, pos);
    CHECK((t == 1 || t == 3));
  }
  const std::vector<float> two_rows = {0, 1, 2, 3, 4, 5};
  const std::vector<sampling_params> one{sampling_params{}};
  const std::vector<std::uint64_t> pos1{0};
  CHECK(!sample_batch(two_rows, 3, one, pos1).ok());
  CHECK(!sample_batch(two_rows, 4, one, pos1).ok());
}

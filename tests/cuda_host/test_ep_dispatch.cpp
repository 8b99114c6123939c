// EP dispatch planning (kernels/ep_dispatch.hpp): placement, dispatch and receive plans, and the
// combine, against a direct per-token computation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "kernels/ep_dispatch.hpp"

using namespace troupe::kernels;

namespace {

// Router-like top-k ids: k distinct experts per token, drawn from a fixed-seed generator.
std::vector<std::int32_t> random_topk(std::int32_t tokens, std::int32_t k, std::int32_t experts,
                                      std::uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::int32_t> ids;
  for (std::int32_t t = 0; t < tokens; ++t) {
    std::vector<std::int32_t> row;
    while (static_cast<std::int32_t>(row.size()) < k) {
      const auto e = static_cast<std::int32_t>(g() % static_cast<std::uint32_t>(experts));
      if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return ids;
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(static_cast<double>(g()) / 4294967296.0 * 2.0 - 1.0);
  return v;
}

// A stand-in expert, row-wise like a real one: f_e(x)[d] = x[d] · a_e + b_e[d].
struct toy_experts {
  std::int64_t width;
  std::vector<float> a, b;
  toy_experts(std::int32_t experts, std::int64_t w) : width(w) {
    a = random_floats(static_cast<std::size_t>(experts), 11);
    b = random_floats(static_cast<std::size_t>(experts * w), 12);
  }
  void apply(std::int32_t e, const float* x, float* y) const {
    for (std::int64_t d = 0; d < width; ++d) {
      const float prod = x[d] * a[static_cast<std::size_t>(e)];
      y[d] = prod + b[static_cast<std::size_t>(e * width + d)];
    }
  }
};

// The direct computation: y[t] = Σ_j w[t,j] · f_{e(t,j)}(x[t]), j ascending.
std::vector<float> direct(const toy_experts& ex, const std::vector<float>& x,
                          const std::vector<std::int32_t>& ids, const std::vector<float>& w,
                          std::int32_t k) {
  const std::int64_t W = ex.width;
  const auto T = static_cast<std::int64_t>(ids.size()) / k;
  std::vector<float> y(static_cast<std::size_t>(T * W), 0.0f), f(static_cast<std::size_t>(W));
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t j = 0; j < k; ++j) {
      ex.apply(ids[static_cast<std::size_t>(t * k + j)], x.data() + t * W, f.data());
      for (std::int64_t d = 0; d < W; ++d) {
        const float prod = w[static_cast<std::size_t>(t * k + j)] * f[static_cast<std::size_t>(d)];
        y[static_cast<std::size_t>(t * W + d)] = y[static_cast<std::size_t>(t * W + d)] + prod;
      }
    }
  return y;
}

// The whole EP path for one source rank: gather, each destination rank runs its segment slot
// by slot (its expert_counts), combine.
std::vector<float> through_ep(const toy_experts& ex, const expert_placement& p,
                              const std::vector<float>& x, const std::vector<std::int32_t>& ids,
                              const std::vector<float>& w, std::int32_t k) {
  auto plan = plan_dispatch(p, ids, k);
  REQUIRE(plan.ok());
  const std::int64_t W = ex.width;
  std::vector<float> send(plan->send_copy.size() * static_cast<std::size_t>(W));
  gather_rows(*plan, x.data(), W, send.data());
  std::vector<float> back(send.size());
  for (std::int32_t r = 0; r < p.ranks; ++r) {
    std::int64_t row = plan->send_offsets[static_cast<std::size_t>(r)];
    const auto& counts = plan->expert_counts[static_cast<std::size_t>(r)];
    for (std::size_t s = 0; s < counts.size(); ++s)
      for (std::int32_t i = 0; i < counts[s]; ++i, ++row)
        ex.apply(p.local[static_cast<std::size_t>(r)][s], send.data() + row * W,
                 back.data() + row * W);
  }
  std::vector<float> y(static_cast<std::size_t>(plan->tokens * W));
  combine_rows(*plan, back.data(), w, W, y.data());
  return y;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("the released layout's 384 experts over EP 8 give every rank a contiguous 48") {
  auto p = place_experts(384, 8);
  REQUIRE(p.ok());
  for (std::int32_t r = 0; r < 8; ++r) {
    REQUIRE(p->local[static_cast<std::size_t>(r)].size() == 48);
    CHECK(p->local[static_cast<std::size_t>(r)].front() == 48 * r);
    CHECK(p->local[static_cast<std::size_t>(r)].back() == 48 * r + 47);
  }
  for (std::int32_t e = 0; e < 384; ++e) {
    REQUIRE(p->homes[static_cast<std::size_t>(e)].size() == 1);
    CHECK(p->slot_of(p->homes[static_cast<std::size_t>(e)][0], e) == e % 48);
  }
}

TEST_CASE("over EP 7 the first six ranks hold 55 experts and the last 54") {
  auto p = place_experts(384, 7);
  REQUIRE(p.ok());
  for (std::int32_t r = 0; r < 6; ++r) CHECK(p->local[static_cast<std::size_t>(r)].size() == 55);
  CHECK(p->local[6].size() == 54);
}

TEST_CASE("hot-expert replicas go to the least loaded rank not holding the expert") {
  const std::vector<std::int32_t> hot{0, 1, 2};
  auto p = place_experts(384, 7, hot);
  REQUIRE(p.ok());
  // Rank 6 (54 experts) takes expert 0; then all hold 55 and rank 0 already has 1, so rank 1
  // takes it; then rank 1 holds 56 and rank 0 has 2, so rank 2 takes 2.
  CHECK(p->homes[0] == std::vector<std::int32_t>{0, 6});
  CHECK(p->homes[1] == std::vector<std::int32_t>{0, 1});
  CHECK(p->homes[2] == std::vector<std::int32_t>{0, 2});
  CHECK(p->local[6].back() == 0);
  CHECK(p->slot_of(6, 0) == 54);
  CHECK(p->slot_of(3, 0) == -1);
}

TEST_CASE("placement refuses fewer experts than ranks, bad replicas and a replica everywhere") {
  CHECK_FALSE(place_experts(4, 8).ok());
  CHECK_FALSE(place_experts(8, 0).ok());
  const std::vector<std::int32_t> out_of_range{384}, twice{3, 3}, one{0};
  CHECK_FALSE(place_experts(384, 8, out_of_range).ok());
  CHECK_FALSE(place_experts(384, 8, twice).ok());
  CHECK_FALSE(place_experts(2, 1, one).ok());  // expert 0 already lives on the only rank
  CHECK(place_experts(4, 2, one).ok());
}

TEST_CASE("the dispatch plan's segments match a naive grouping of the copies") {
  auto p = place_experts(384, 8);
  REQUIRE(p.ok());
  const std::int32_t T = 50, k = 6;
  const auto ids = random_topk(T, k, 384, 1);
  auto plan = plan_dispatch(*p, ids, k);
  REQUIRE(plan.ok());
  // Naive: for each rank, the copies bound there sorted by (expert, copy number).
  std::vector<std::int32_t> expected;
  for (std::int32_t r = 0; r < 8; ++r) {
    std::vector<std::pair<std::int32_t, std::int32_t>> mine;
    for (std::int32_t c = 0; c < T * k; ++c)
      if (ids[static_cast<std::size_t>(c)] / 48 == r) mine.push_back({ids[static_cast<std::size_t>(c)], c});
    std::sort(mine.begin(), mine.end());
    CHECK(plan->send_counts[static_cast<std::size_t>(r)] == static_cast<std::int32_t>(mine.size()));
    CHECK(plan->send_offsets[static_cast<std::size_t>(r)] == static_cast<std::int32_t>(expected.size()));
    for (auto [e, c] : mine) expected.push_back(c);
  }
  CHECK(plan->send_copy == expected);
  for (std::size_t i = 0; i < plan->send_copy.size(); ++i)
    CHECK(plan->copy_row[static_cast<std::size_t>(plan->send_copy[i])] == static_cast<std::int32_t>(i));
  std::int32_t sum = 0;
  for (const auto& counts : plan->expert_counts)
    for (auto n : counts) sum += n;
  CHECK(sum == T * k);
}

TEST_CASE("dispatch, experts and combine equal the direct per-token sum bit for bit") {
  const std::int32_t T = 40, k = 6, E = 384;
  const std::int64_t W = 16;
  toy_experts ex(E, W);
  const auto ids = random_topk(T, k, E, 2);
  const auto x = random_floats(static_cast<std::size_t>(T * W), 3);
  const auto w = random_floats(static_cast<std::size_t>(T * k), 4);
  const auto want = direct(ex, x, ids, w, k);
  for (std::int32_t ranks : {1, 7, 8, 64}) {
    auto p = place_experts(E, ranks);
    REQUIRE(p.ok());
    const auto got = through_ep(ex, *p, x, ids, w, k);
    CAPTURE(ranks);
    CHECK(same_bits(got.data(), want.data(), want.size()));
  }
}

TEST_CASE("hot-expert replicas move copies to other ranks without changing any result") {
  const std::int32_t T = 64, k = 6, E = 384;
  const std::int64_t W = 8;
  toy_experts ex(E, W);
  // Every token picks expert 5, the hot one.
  auto ids = random_topk(T, k, E, 5);
  for (std::int32_t t = 0; t < T; ++t)
    if (std::find(ids.begin() + t * k, ids.begin() + (t + 1) * k, 5) == ids.begin() + (t + 1) * k)
      ids[static_cast<std::size_t>(t * k)] = 5;
  const auto x = random_floats(static_cast<std::size_t>(T * W), 6);
  const auto w = random_floats(static_cast<std::size_t>(T * k), 7);
  const std::vector<std::int32_t> hot{5};
  auto plain = place_experts(E, 8), replicated = place_experts(E, 8, hot);
  REQUIRE(plain.ok());
  REQUIRE(replicated.ok());
  auto a = plan_dispatch(*plain, ids, k), b = plan_dispatch(*replicated, ids, k);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::int32_t replica_rank = replicated->homes[5][1];
  CHECK(b->expert_counts[static_cast<std::size_t>(replica_rank)].back() > 0);  // the replica works
  CHECK(b->expert_counts[0][5] < a->expert_counts[0][5]);
  const auto ya = through_ep(ex, *plain, x, ids, w, k), yb = through_ep(ex, *replicated, x, ids, w, k);
  CHECK(same_bits(ya.data(), yb.data(), ya.size()));
}

TEST_CASE("a token's combined row is the same bits whatever batch it travels in") {
  const std::int32_t T = 48, k = 6, E = 384;
  const std::int64_t W = 12;
  toy_experts ex(E, W);
  const auto ids = random_topk(T, k, E, 8);
  const auto x = random_floats(static_cast<std::size_t>(T * W), 9);
  const auto w = random_floats(static_cast<std::size_t>(T * k), 10);
  auto p = place_experts(E, 8);
  REQUIRE(p.ok());
  const auto full = through_ep(ex, *p, x, ids, w, k);
  // The odd tokens alone, in reverse order.
  std::vector<std::int32_t> pick;
  for (std::int32_t t = T - 1; t >= 0; t -= 2) pick.push_back(t);
  std::vector<std::int32_t> sub_ids;
  std::vector<float> sub_x, sub_w;
  for (auto t : pick) {
    sub_ids.insert(sub_ids.end(), ids.begin() + t * k, ids.begin() + (t + 1) * k);
    sub_x.insert(sub_x.end(), x.begin() + t * W, x.begin() + (t + 1) * W);
    sub_w.insert(sub_w.end(), w.begin() + t * k, w.begin() + (t + 1) * k);
  }
  const auto part = through_ep(ex, *p, sub_x, sub_ids, sub_w, k);
  for (std::size_t i = 0; i < pick.size(); ++i)
    CHECK(same_bits(part.data() + static_cast<std::int64_t>(i) * W, full.data() + pick[i] * W,
                    static_cast<std::size_t>(W)));
}

TEST_CASE("the receive plan orders rows from several sources slot by slot for the grouped GEMM") {
  // Three source ranks each dispatch their own tokens; rank 1 of EP 4 receives, groups by
  // slot, runs each slot's rows, scatters back, and each source combines: equal to direct.
  const std::int32_t k = 6, E = 384, S = 4;
  const std::int64_t W = 4;
  toy_experts ex(E, W);
  auto p = place_experts(E, S);
  REQUIRE(p.ok());
  std::vector<std::vector<std::int32_t>> ids(S);
  std::vector<std::vector<float>> xs(S), ws(S), sends(S), backs(S);
  std::vector<dispatch_plan> plans;
  for (std::int32_t s = 0; s < S; ++s) {
    const std::int32_t T = 10 + 3 * s;
    ids[static_cast<std::size_t>(s)] = random_topk(T, k, E, 20 + static_cast<std::uint32_t>(s));
    xs[static_cast<std::size_t>(s)] = random_floats(static_cast<std::size_t>(T * W), 30 + static_cast<std::uint32_t>(s));
    ws[static_cast<std::size_t>(s)] = random_floats(static_cast<std::size_t>(T * k), 40 + static_cast<std::uint32_t>(s));
    auto plan = plan_dispatch(*p, ids[static_cast<std::size_t>(s)], k);
    REQUIRE(plan.ok());
    sends[static_cast<std::size_t>(s)].resize(plan->send_copy.size() * W);
    gather_rows(*plan, xs[static_cast<std::size_t>(s)].data(), W, sends[static_cast<std::size_t>(s)].data());
    backs[static_cast<std::size_t>(s)].resize(sends[static_cast<std::size_t>(s)].size());
    plans.push_back(std::move(*plan));
  }
  for (std::int32_t dst = 0; dst < S; ++dst) {
    // The all-to-all: dst receives every source's segment for it, in source order.
    std::vector<std::vector<std::int32_t>> counts;
    std::vector<float> recv;
    for (std::int32_t s = 0; s < S; ++s) {
      const auto& pl = plans[static_cast<std::size_t>(s)];
      counts.push_back(pl.expert_counts[static_cast<std::size_t>(dst)]);
      const auto* seg = sends[static_cast<std::size_t>(s)].data() + pl.send_offsets[static_cast<std::size_t>(dst)] * W;
      recv.insert(recv.end(), seg, seg + pl.send_counts[static_cast<std::size_t>(dst)] * W);
    }
    auto rp = plan_receive(counts);
    REQUIRE(rp.ok());
    REQUIRE(rp->order.size() * W == recv.size());
    std::vector<float> out(recv.size());
    for (std::size_t slot = 0; slot + 1 < rp->slot_offsets.size(); ++slot)
      for (auto i = rp->slot_offsets[slot]; i < rp->slot_offsets[slot + 1]; ++i) {
        const auto row = rp->order[static_cast<std::size_t>(i)];
        ex.apply(p->local[static_cast<std::size_t>(dst)][slot], recv.data() + row * W, out.data() + row * W);
      }
    // The reverse all-to-all: each source's rows back into its send-buffer positions.
    std::int64_t at = 0;
    for (std::int32_t s = 0; s < S; ++s) {
      const auto& pl = plans[static_cast<std::size_t>(s)];
      const std::int64_t n = pl.send_counts[static_cast<std::size_t>(dst)] * W;
      std::copy(out.begin() + at, out.begin() + at + n,
                backs[static_cast<std::size_t>(s)].begin() + pl.send_offsets[static_cast<std::size_t>(dst)] * W);
      at += n;
    }
  }
  for (std::int32_t s = 0; s < S; ++s) {
    const auto& pl = plans[static_cast<std::size_t>(s)];
    std::vector<float> y(static_cast<std::size_t>(pl.tokens * W));
    combine_rows(pl, backs[static_cast<std::size_t>(s)].data(), ws[static_cast<std::size_t>(s)], W, y.data());
    const auto want = direct(ex, xs[static_cast<std::size_t>(s)], ids[static_cast<std::size_t>(s)], ws[static_cast<std::size_t>(s)], k);
    CAPTURE(s);
    CHECK(same_bits(y.data(), want.data(), y.size()));
  }
}

TEST_CASE("plans refuse expert ids out of range, ragged rows and ragged receive counts") {
  auto p = place_experts(16, 4);
  REQUIRE(p.ok());
  const std::vector<std::int32_t> bad{0, 16}, ragged{0, 1, 2};
  CHECK_FALSE(plan_dispatch(*p, bad, 2).ok());
  CHECK_FALSE(plan_dispatch(*p, ragged, 2).ok());
  CHECK_FALSE(plan_dispatch(*p, ragged, 0).ok());
  CHECK_FALSE(plan_receive({{1, 2}, {3}}).ok());
  CHECK_FALSE(plan_receive({{1, -1}}).ok());
  auto empty = plan_dispatch(*p, std::vector<std::int32_t>{}, 6);
  REQUIRE(empty.ok());
  CHECK(empty->tokens == 0);
  CHECK(empty->send_counts == std::vector<std::int32_t>(4, 0));
}

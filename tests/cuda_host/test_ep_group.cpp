// EP group bookkeeping (kernels/ep_group.hpp): ranks, the unique-id exchange, and the rebuild
// after a failure.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "kernels/ep_group.hpp"

using namespace troupe::kernels;

namespace {

std::array<std::uint8_t, nccl_unique_id_bytes> some_id(std::uint8_t seed) {
  std::array<std::uint8_t, nccl_unique_id_bytes> id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::uint8_t>(seed + 7 * i);
  return id;
}

std::set<std::int32_t> held(const ep_group_plan& p, gpu_id gpu) {
  const auto& l = p.placement.local[static_cast<std::size_t>(p.rank_of(gpu))];
  return {l.begin(), l.end()};
}

}  // namespace

TEST_CASE("ranks follow ascending GPU ids whatever order the healthy GPUs are reported in") {
  const std::vector<gpu_id> a{13, 10, 12, 11}, b{11, 12, 13, 10};
  auto p = form_ep_group(1, 1, a, 384), q = form_ep_group(1, 1, b, 384);
  REQUIRE(p.ok());
  REQUIRE(q.ok());
  CHECK(p->members == std::vector<gpu_id>{10, 11, 12, 13});
  CHECK(p->members == q->members);
  CHECK(p->root() == 10);
  CHECK(p->rank_of(12) == 2);
  CHECK(p->rank_of(14) == -1);
  const std::vector<gpu_id> dup{1, 2, 1};
  CHECK_FALSE(form_ep_group(1, 1, dup, 384).ok());
  CHECK_FALSE(form_ep_group(1, 1, std::vector<gpu_id>{}, 384).ok());
}

TEST_CASE("the root's unique id reaches every member as one message and gives each its rank") {
  const std::vector<gpu_id> gpus{0, 1, 2, 3, 4, 5, 6, 7};
  auto p = form_ep_group(9, 3, gpus, 384);
  REQUIRE(p.ok());
  const auto id = some_id(42);
  const auto bytes = encode(unique_id_message(*p, id));
  std::set<std::int32_t> ranks;
  for (auto gpu : gpus) {
    auto m = decode_nccl_id_message(bytes);  // each member decodes its own copy
    REQUIRE(m.ok());
    auto args = accept_unique_id(*p, gpu, *m);
    REQUIRE(args.ok());
    CHECK(args->nranks == 8);
    CHECK(args->id == id);
    ranks.insert(args->rank);
  }
  CHECK(ranks == std::set<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("a member ignores ids of another generation, another instance or a group it is not in") {
  const std::vector<gpu_id> old_gpus{0, 1, 2, 3, 4, 5, 6, 7}, new_gpus{0, 1, 2, 3, 4, 6, 7};
  auto g1 = form_ep_group(9, 1, old_gpus, 384), g2 = form_ep_group(9, 2, new_gpus, 384);
  REQUIRE(g1.ok());
  REQUIRE(g2.ok());
  const auto stale = unique_id_message(*g1, some_id(1));
  CHECK_FALSE(accept_unique_id(*g2, 0, stale).ok());
  auto fresh = unique_id_message(*g2, some_id(2));
  CHECK(accept_unique_id(*g2, 7, fresh).ok());
  CHECK(accept_unique_id(*g2, 7, fresh)->rank == 6);
  CHECK_FALSE(accept_unique_id(*g2, 5, fresh).ok());  // the failed GPU
  auto other = fresh;
  other.instance = 10;
  CHECK_FALSE(accept_unique_id(*g2, 0, other).ok());
  auto wrong_size = fresh;
  wrong_size.size = 8;
  CHECK_FALSE(accept_unique_id(*g2, 0, wrong_size).ok());
  auto bytes = encode(fresh);
  CHECK_FALSE(decode_nccl_id_message(bytes.substr(1)).ok());
  bytes[0] = 'X';
  CHECK_FALSE(decode_nccl_id_message(bytes).ok());
}

TEST_CASE("an EP 8 group that loses a GPU re-forms as 7 with a new communicator and every expert homed") {
  const std::vector<gpu_id> before{0, 1, 2, 3, 4, 5, 6, 7}, after{0, 1, 2, 3, 4, 6, 7};
  auto g1 = form_ep_group(4, 1, before, 384), g2 = form_ep_group(4, 2, after, 384);
  REQUIRE(g1.ok());
  REQUIRE(g2.ok());
  auto rb = plan_rebuild(*g1, *g2, /*communicator_alive=*/true);
  REQUIRE(rb.ok());
  CHECK(rb->new_communicator);  // a member is gone: a communicator cannot shrink
  CHECK(rb->lost == std::vector<gpu_id>{5});
  REQUIRE(rb->ranks.size() == 7);
  for (std::int32_t e = 0; e < 384; ++e) {
    const auto& homes = g2->placement.homes[static_cast<std::size_t>(e)];
    REQUIRE_FALSE(homes.empty());
    CHECK(homes[0] < 7);
  }
  std::set<std::int32_t> everything;
  for (const auto& r : rb->ranks) {
    const auto old_set = g1->rank_of(r.gpu) >= 0 ? held(*g1, r.gpu) : std::set<std::int32_t>{};
    const auto new_set = held(*g2, r.gpu);
    // What it keeps plus what it loads is what it now holds; what it drops it held before.
    std::set<std::int32_t> kept;
    std::set_intersection(old_set.begin(), old_set.end(), new_set.begin(), new_set.end(),
                          std::inserter(kept, kept.begin()));
    std::set<std::int32_t> now = kept;
    now.insert(r.load.begin(), r.load.end());
    CHECK(now == new_set);
    for (auto e : r.drop) CHECK(old_set.count(e) == 1);
    for (auto e : r.load) CHECK(old_set.count(e) == 0);
    CHECK(r.new_rank == g2->rank_of(r.gpu));
    CHECK(r.old_rank == g1->rank_of(r.gpu));
    everything.insert(new_set.begin(), new_set.end());
  }
  CHECK(everything.size() == 384);
  // GPU 5 held experts 240..287 and nobody else did: exactly those come from the checkpoint.
  std::vector<std::int32_t> lost_experts;
  for (std::int32_t e = 240; e < 288; ++e) lost_experts.push_back(e);
  CHECK(rb->from_checkpoint == lost_experts);
  // GPU 6 (rank 6 -> rank 5) held 288..335 and now holds 275..329: it keeps 288..329, loads
  // 275..287 and drops 330..335.
  const auto& r5 = rb->ranks[5];
  CHECK(r5.gpu == 6);
  CHECK(held(*g2, 6).size() == 55);
  REQUIRE(r5.load.size() == 13);
  CHECK(r5.load.front() == 275);
  CHECK(r5.load.back() == 287);
  REQUIRE(r5.drop.size() == 6);
  CHECK(r5.drop.front() == 330);
}

TEST_CASE("a replica of a hot expert on a surviving GPU spares it the checkpoint") {
  const std::vector<gpu_id> before{0, 1, 2, 3, 4, 5, 6, 7}, after{0, 1, 2, 3, 4, 6, 7};
  const std::vector<std::int32_t> hot{250};
  auto g1 = form_ep_group(4, 1, before, 384, hot), g2 = form_ep_group(4, 2, after, 384);
  REQUIRE(g1.ok());
  REQUIRE(g2.ok());
  REQUIRE(g1->placement.homes[250].size() == 2);
  auto rb = plan_rebuild(*g1, *g2);
  REQUIRE(rb.ok());
  CHECK(std::count(rb->from_checkpoint.begin(), rb->from_checkpoint.end(), 250) == 0);
  CHECK(rb->from_checkpoint.size() == 47);
}

TEST_CASE("the same members in a later generation keep their experts, and their communicator if it survived") {
  const std::vector<gpu_id> gpus{3, 4};
  auto g1 = form_ep_group(1, 5, gpus, 16), g2 = form_ep_group(1, 6, gpus, 16);
  REQUIRE(g1.ok());
  REQUIRE(g2.ok());
  auto rb = plan_rebuild(*g1, *g2, /*communicator_alive=*/true);
  REQUIRE(rb.ok());
  CHECK_FALSE(rb->new_communicator);
  CHECK(rb->lost.empty());
  CHECK(rb->from_checkpoint.empty());
  for (const auto& r : rb->ranks) {
    CHECK(r.load.empty());
    CHECK(r.drop.empty());
  }
  CHECK_FALSE(plan_rebuild(*g2, *g1).ok());  // generations only move forward
  // After a failure the old communicator was aborted: the same members need a new one.
  auto after_failure = plan_rebuild(*g1, *g2, /*communicator_alive=*/false);
  REQUIRE(after_failure.ok());
  CHECK(after_failure->new_communicator);
}

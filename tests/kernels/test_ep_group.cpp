// An expert-parallel group's ranks as threads of one process (kernels/ep_exchange.hpp,
// model_options::ep, kernels/ep_group_backend.hpp): the exchange's all-gather and abort, rank
// models that hold only their experts and give the whole model's logits bit for bit, and the
// group as one backend (steps, KV export and import, a refused input, a failed rank); then its
// ranks spread over processes (kernels/ep_process.hpp: forked peers, one killed).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/ep_exchange.hpp"
#include "kernels/ep_group_backend.hpp"
#include "kernels/generate.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/model.hpp"
#include "kernels/model_weights.hpp"
#include "ep_fixture.hpp"
#include "model_fixture.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

using testing::prompt;

const fs::path& tiny_dir() {
  static const fs::path dir = testing::write_random_model(
    fs::path(TROUPE_SOURCE_DIR) / "tests/kernels/fixtures/tiny-v41-config.json", "ep-tiny", 17);
  return dir;
}

result<bool> identity_map(model& m) {
  return m.set_engram_token_map(*load_engram_token_map(m, "identity"));
}

model load(model_options options) {
  auto m = model::load(tiny_dir(), std::move(options));
  REQUIRE_MESSAGE(m.ok(), m.error());
  REQUIRE(identity_map(*m).ok());
  return std::move(*m);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::int64_t argmax_last(const std::vector<float>& logits, std::int64_t vocab) {
  return std::max_element(logits.end() - vocab, logits.end()) - (logits.end() - vocab);
}


}  // namespace

TEST_CASE("the local exchange gathers every rank's segment, round after round") {
  constexpr int ranks = 3, rounds = 200;
  auto ex = local_exchange(ranks);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      for (int round = 0; round < rounds; ++round) {
        // Segment sizes change every round; rank 1's is empty every third one.
        std::vector<std::int64_t> offsets{0};
        for (int o = 0; o < ranks; ++o)
          offsets.push_back(offsets.back() + ((o == 1 && round % 3 == 0) ? 0 : 1 + (round + o) % 5));
        std::vector<float> buf(std::size_t(offsets.back()), -1.0f);
        for (auto i = offsets[r]; i < offsets[r + 1]; ++i) buf[std::size_t(i)] = float(round * 100 + r);
        if (!ex->all_gather(r, buf, offsets)) ++wrong;
        for (int o = 0; o < ranks; ++o)
          for (auto i = offsets[o]; i < offsets[o + 1]; ++i)
            if (buf[std::size_t(i)] != float(round * 100 + o)) ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);

  std::vector<float> buf(2);
  const std::int64_t bad[] = {0, 1};
  CHECK_FALSE(ex->all_gather(0, buf, bad).ok());  // 2 offsets for 3 ranks
}

TEST_CASE("an aborted exchange releases the ranks waiting in it and fails later calls") {
  auto ex = local_exchange(2);
  std::vector<float> buf(2, 0.0f);
  const std::int64_t offsets[] = {0, 1, 2};
  std::string error;
  std::thread waiter([&] {
    auto r = ex->all_gather(0, buf, offsets);  // rank 1 never comes
    error = r.ok() ? "" : r.error();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ex->abort("rank 1 died");
  waiter.join();
  CHECK(error == "EP group aborted: rank 1 died");
  auto again = ex->all_gather(1, buf, offsets);
  REQUIRE_FALSE(again.ok());
  CHECK(again.error() == "EP group aborted: rank 1 died");

  // Reset once nobody is inside: the group works again.
  ex->reset();
  std::thread other([&] { (void)ex->all_gather(1, buf, offsets); });
  CHECK(ex->all_gather(0, buf, offsets).ok());
  other.join();
}

TEST_CASE("EP ranks hold only their experts and give the whole model's logits bit for bit") {
  const auto whole = load({.batch_invariant = true});
  const auto V = whole.text().vocab_size;
  const auto toks = prompt(37, 5, V);
  auto c = whole.new_sequence();
  const auto ref = testing::run(whole, c, toks);

  const std::int32_t hot[] = {3};
  for (const auto& placement : {*place_experts(8, 2), *place_experts(8, 3, hot)}) {
    CAPTURE(placement.ranks);
    auto ex = local_exchange(placement.ranks);
    auto shared = std::make_shared<tensor_cache>();
    std::vector<model> ranks;
    for (std::int32_t r = 0; r < placement.ranks; ++r)
      ranks.push_back(load({.batch_invariant = true, .ep = ep_member{r, placement, ex},
                            .tensors = shared}));
    // One copy of the dense weights for the group.
    const auto& w0 = ranks[0].tensors();
    const auto& w1 = ranks[1].tensors();
    CHECK(w0.layers[2].wq_a.shared == w1.layers[2].wq_a.shared);
    CHECK(w0.layers[5].shared.w2.shared == w1.layers[5].shared.w2.shared);
    CHECK(w0.embed.shared == w1.embed.shared);
    CHECK(w0.layers[0].wq_a.shared != whole.tensors().layers[0].wq_a.shared);
    for (std::int32_t r = 0; r < placement.ranks; ++r) {
      const auto& layer = ranks[std::size_t(r)].tensors().layers.front();
      const auto& local = placement.local[std::size_t(r)];
      for (std::int32_t e = 0; e < 8; ++e) {
        const bool held = std::find(local.begin(), local.end(), e) != local.end();
        CHECK((layer.experts[std::size_t(e)].w1.size() == 0) == !held);
      }
    }
    // The prompt: rank 0's logits equal the whole model's; the others skip the LM head.
    std::vector<std::vector<float>> got(ranks.size());
    std::vector<char> ok(ranks.size(), 0);
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < ranks.size(); ++r)
      threads.emplace_back([&, r] {
        auto cache = ranks[r].new_sequence();
        sequence_input in{&cache, toks};
        auto out = ranks[r].forward(std::span(&in, 1));
        ok[r] = out ? 1 : 0;
        if (out) got[r] = std::move(*out);
      });
    for (auto& t : threads) t.join();
    CHECK(std::count(ok.begin(), ok.end(), 1) == static_cast<std::ptrdiff_t>(ranks.size()));
    CHECK(same_bits(got[0], ref));
    for (std::size_t r = 1; r < got.size(); ++r) CHECK(got[r].empty());
    CHECK(ranks[1].set_expert_placement(std::nullopt).error()
          == "expert placement: this model is rank 1 of an EP group, which places the experts");
  }

  // A placement of the wrong size, or an exchange of another size, is refused at load.
  auto seven = *place_experts(7, 2);
  auto bad = model::load(tiny_dir(), {.ep = ep_member{0, seven, local_exchange(2)}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("places 7 experts, the model has 8") != std::string::npos);
  bad = model::load(tiny_dir(), {.ep = ep_member{0, *place_experts(8, 2), local_exchange(3)}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error() == "model: EP rank 0 of a 2-rank placement needs an exchange of that many ranks");
}

namespace {

// The checks of a group that serves as the whole model's backend does: steps, KV both ways,
// refused inputs that leave it usable.
void check_serves_as_the_whole_model(model_backend& group) {
  cpu_backend whole(load({.batch_invariant = true}));
  const auto V = whole.cpu_model().text().vocab_size;

  // Two sequences in one batch, then 10 greedy steps of both: the same logits.
  const auto p0 = prompt(140, 1, V), p1 = prompt(9, 2, V);
  const sequence_id a = whole.open_sequence(), b = whole.open_sequence();
  REQUIRE(group.open_sequence() == a);
  REQUIRE(group.open_sequence() == b);
  std::vector<step_input> batch{{a, p0}, {b, p1}};
  auto ref = whole.step(batch);
  auto got = group.step(batch);
  REQUIRE(ref.ok());
  REQUIRE_MESSAGE(got.ok(), got.error());
  CHECK(same_bits(*got, *ref));
  std::vector<std::int64_t> next{argmax_last(*ref, V), 0};
  for (int s = 0; s < 10; ++s) {
    next[1] = std::int64_t(3 + s);
    const std::vector<step_input> step{{a, std::span(next).first(1)}, {b, std::span(next).last(1)}};
    const std::int64_t rows[] = {1, 1};
    ref = whole.step_tail(step, rows, nullptr);
    got = group.step_tail(step, rows, nullptr);
    REQUIRE_MESSAGE(got.ok(), got.error());
    CHECK(same_bits(*got, *ref));
    next[0] = argmax_last(std::vector<float>(ref->begin(), ref->begin() + V), V);
  }
  CHECK(*group.length(a) == *whole.length(a));
  CHECK(group.expert_counts() == whole.expert_counts());

  // KV out of the group imports into the whole model's backend, and back: the continuations
  // agree bit for bit.
  REQUIRE(*group.full_blocks(a) == 1);
  CHECK(*group.export_block(a, 0) == *whole.export_block(a, 0));
  CHECK(*group.export_state(a) == *whole.export_state(a));
  CHECK(*group.export_swa(a) == *whole.export_swa(a));
  const sequence_id g2 = group.open_sequence(), w2 = whole.open_sequence();
  REQUIRE(group.import_block(g2, 0, *whole.export_block(a, 0)).ok());
  REQUIRE(group.import_state(g2, *whole.export_state(a)).ok());
  REQUIRE(group.import_swa(g2, *whole.export_swa(a)).ok());
  REQUIRE(whole.import_block(w2, 0, *group.export_block(a, 0)).ok());
  REQUIRE(whole.import_state(w2, *group.export_state(a)).ok());
  REQUIRE(whole.import_swa(w2, *group.export_swa(a)).ok());
  const std::int64_t t[] = {42};
  const std::vector<step_input> cont_g{{g2, t}}, cont_w{{w2, t}};
  got = group.step(cont_g);
  ref = whole.step(cont_w);
  REQUIRE(got.ok());
  CHECK(same_bits(*got, *ref));

  // A refused input (a corrupt block, an unknown sequence) fails that call only.
  auto corrupt = *whole.export_block(a, 0);
  corrupt[corrupt.size() / 2] ^= 1;
  const sequence_id g3 = group.open_sequence();
  CHECK_FALSE(group.import_block(g3, 0, corrupt).ok());
  CHECK_FALSE(group.close_sequence(999).ok());
  const std::vector<step_input> unknown{{999, t}};
  CHECK_FALSE(group.step(unknown).ok());
  CHECK(group.step(std::vector<step_input>{{g3, p1}}).ok());
  CHECK(group.set_expert_placement(std::nullopt).error().find("keeps the placement") !=
        std::string::npos);
  CHECK(group.close_sequence(g3).ok());
}

}  // namespace

TEST_CASE("an EP group backend serves as the whole model's backend does") {
  const std::int32_t hot[] = {5, 0};
  auto opened = open_ep_group(tiny_dir(), {.batch_invariant = true}, *place_experts(8, 3, hot),
                              identity_map);
  REQUIRE_MESSAGE(opened.ok(), opened.error());
  check_serves_as_the_whole_model(**opened);
}

TEST_CASE("a rank that fails in a step fails its whole EP group") {
  auto placement = *place_experts(8, 2);
  auto ex = std::make_shared<testing::failing_exchange>(2, 1, 8);  // rank 1, in its 8th MoE
  auto opened = open_ep_group(tiny_dir(), {.batch_invariant = true}, placement, identity_map, ex);
  REQUIRE(opened.ok());
  auto& group = **opened;
  CHECK(group.broken().empty());
  const auto id = group.open_sequence();
  const auto toks = prompt(20, 9, 256);
  auto first = group.step(std::vector<step_input>{{id, toks}});  // 6 MoEs: fine
  REQUIRE_MESSAGE(first.ok(), first.error());
  const std::int64_t t[] = {7};
  auto second = group.step(std::vector<step_input>{{id, t}});
  REQUIRE_FALSE(second.ok());
  CHECK(second.error() == "the EP group failed: rank 1: rank 1's device failed");
  CHECK(group.broken() == second.error());
  // From then on every call that changes a sequence fails the same way.
  CHECK(group.step(std::vector<step_input>{{id, t}}).error() == second.error());
  CHECK(group.close_sequence(id).error() == second.error());
}

namespace {

// A peer process of an EP group (kernels/ep_process.hpp): a child that serves `ranks` at the
// other end of a socketpair until the group closes it, and exits 0 then (3 on a load error).
struct peer_process {
  pid_t pid = -1;
  int fd = -1;
  int exit_status() const {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

peer_process start_peer(std::vector<std::int32_t> ranks, const expert_placement& placement,
                        const fs::path& dir = tiny_dir()) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(sv[0]);
    auto ok = serve_ep_peer(sv[1], dir, {.batch_invariant = true}, placement, std::move(ranks),
                            identity_map);
    ::_exit(ok ? 0 : 3);
  }
  ::close(sv[1]);
  return {pid, sv[0]};
}

}  // namespace

TEST_CASE("an EP group whose ranks are in several processes serves as the whole model does") {
  // Ranks 0 and 1 here; 2 and 3 in one peer process; 4 in another (one hot replica).
  const std::int32_t hot[] = {5, 0};
  const auto placement = *place_experts(8, 5, hot);
  auto a = start_peer({2, 3}, placement), b = start_peer({4}, placement);
  {
    auto opened = open_ep_group(tiny_dir(), {.batch_invariant = true}, placement, identity_map,
                                {}, {{a.fd, {2, 3}}, {b.fd, {4}}});
    REQUIRE_MESSAGE(opened.ok(), opened.error());
    check_serves_as_the_whole_model(**opened);
    CHECK((*opened)->broken().empty());
  }
  // Closing the group ends its peers.
  CHECK(a.exit_status() == 0);
  CHECK(b.exit_status() == 0);
}

TEST_CASE("a peer process that dies fails its EP group, and one that cannot load fails the open") {
  const auto placement = *place_experts(8, 3);
  auto peer = start_peer({1, 2}, placement);
  auto opened = open_ep_group(tiny_dir(), {.batch_invariant = true}, placement, identity_map, {},
                              {{peer.fd, {1, 2}}});
  REQUIRE_MESSAGE(opened.ok(), opened.error());
  auto& group = **opened;
  const auto id = group.open_sequence();
  const auto toks = prompt(20, 9, 256);
  REQUIRE(group.step(std::vector<step_input>{{id, toks}}).ok());
  REQUIRE(::kill(peer.pid, SIGKILL) == 0);
  CHECK(peer.exit_status() == 128 + SIGKILL);
  const std::int64_t t[] = {7};
  auto next = group.step(std::vector<step_input>{{id, t}});
  REQUIRE_FALSE(next.ok());
  CHECK(next.error().rfind("the EP group failed: rank 1: the process of ranks 1, 2 is gone", 0) == 0);
  CHECK(group.broken() == next.error());
  CHECK(group.close_sequence(id).error() == next.error());

  // A peer that hangs (stopped) fails its group once it has not answered in time.
  auto stopped = start_peer({1, 2}, placement);
  auto slow = open_ep_group(tiny_dir(), {.batch_invariant = true}, placement, identity_map, {},
                            {{stopped.fd, {1, 2}, std::chrono::milliseconds(300)}});
  REQUIRE_MESSAGE(slow.ok(), slow.error());
  const auto sid = (*slow)->open_sequence();
  REQUIRE(::kill(stopped.pid, SIGSTOP) == 0);
  auto hung = (*slow)->step(std::vector<step_input>{{sid, toks}});
  REQUIRE_FALSE(hung.ok());
  CHECK(hung.error() == "the EP group failed: rank 1: the process of ranks 1, 2 did not answer "
                        "within 300 ms");
  REQUIRE(::kill(stopped.pid, SIGKILL) == 0);
  CHECK(stopped.exit_status() == 128 + SIGKILL);

  // A peer whose ranks cannot load (a directory without the model) fails the group's open with
  // its reason; so does a peer given ranks that are the leader's.
  const auto missing = fs::temp_directory_path() / "troupe-ep-no-model";
  auto bad = start_peer({1, 2}, placement, missing);
  auto refused = open_ep_group(tiny_dir(), {.batch_invariant = true}, placement, identity_map, {},
                               {{bad.fd, {1, 2}}});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().rfind("EP group rank 1: ", 0) == 0);
  CHECK(bad.exit_status() == 3);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  ::close(sv[1]);
  refused = open_ep_group(tiny_dir(), {.batch_invariant = true}, placement, identity_map, {},
                          {{sv[0], {0, 1}}});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error() == "EP group: a peer process's ranks must be distinct, above 0 and below 3");
}

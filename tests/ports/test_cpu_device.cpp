// The CPU device port on a tiny random model: greedy parity with `troupe generate`, batch
// invariance, chunked prefill, validation, sampling and logprobs, release, and the KV hand-off.
#include "device_fixture.hpp"

#include "kernels/ep_group_backend.hpp"
#include "kernels/sampling.hpp"
#include "tests/kernels/ep_fixture.hpp"
#include "ports/cpu_device.hpp"
#include "ports/rank_processes.hpp"

#include <doctest/doctest.h>
#include <xxhash.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <numeric>

using namespace troupe;
using namespace troupe::test;
using runtime::device_errc;

namespace {

std::vector<std::int32_t> slice(const std::vector<std::int32_t>& v, std::size_t from,
                                std::size_t to) {
  return {v.begin() + static_cast<std::ptrdiff_t>(from),
          v.begin() + static_cast<std::ptrdiff_t>(to)};
}

/// The log-softmax of the logits after `prompt` on `m` (a fresh sequence).
std::vector<double> log_softmax_after(const kernels::model& m,
                                      const std::vector<std::int32_t>& prompt) {
  std::vector<std::int64_t> toks(prompt.begin(), prompt.end());
  auto cache = m.new_sequence();
  kernels::sequence_input in{&cache, toks};
  auto logits = m.forward(std::span(&in, 1));
  REQUIRE_MESSAGE(logits.ok(), logits.error());
  const auto vocab = static_cast<std::size_t>(m.text().vocab_size);
  std::vector<double> row(logits->end() - static_cast<std::ptrdiff_t>(vocab), logits->end());
  const double top = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (double v : row)
    sum += std::exp(v - top);
  for (double& v : row)
    v -= top + std::log(sum);
  return row;
}

bool is_error(const caf::expected<runtime::device_result>& r, device_errc code) {
  return !r && runtime::is(r.error(), code);
}

} // namespace

TEST_CASE_FIXTURE(device_fixture,
                  "prefill then greedy decode on a CPU device gives troupe generate's tokens") {
  const auto pr = prompt(23, 1);
  const std::size_t n = 12;
  std::vector<std::int64_t> p64(pr.begin(), pr.end());
  kernels::generate_options opts;
  opts.max_new = static_cast<std::int64_t>(n);
  opts.sampling.greedy = true;
  opts.stop_at_eos = false; // the device knows no end of sequence: --ignore-eos
  auto expect = [&](kernels::model_options options) {
    auto want = kernels::generate(load_tiny(options), p64, opts);
    REQUIRE_MESSAGE(want.ok(), want.error());
    return std::vector<std::int32_t>(want->tokens.begin(), want->tokens.end());
  };
  SUBCASE("as troupe generate loads the model (not batch-invariant)") {
    auto p = tiny_params();
    p.batch_invariant = false;
    auto dev = cpu(std::move(p));
    CHECK(greedy(dev, 1, pr, n) == expect({.threads = 2}));
  }
  SUBCASE("batch-invariant, the device's default") {
    auto dev = cpu(tiny_params());
    CHECK(greedy(dev, 1, pr, n) == expect({.threads = 2, .batch_invariant = true}));
  }
}

TEST_CASE_FIXTURE(device_fixture,
                  "a sequence decodes the same tokens alone and in a batch with seven others") {
  auto dev = cpu(tiny_params());
  const auto a = prompt(19, 2);
  const std::size_t n = 10;
  std::vector<float> alone_logprobs, batched_logprobs;
  const auto alone = greedy(dev, 100, a, n, &alone_logprobs);

  // Sequence 1 is `a`, prefilled in one step; sequences 2..8 start at steps 0..6 with prompts
  // of 9..45 tokens in chunks of 8, so that their prefill chunks run beside a's decode, and
  // sample with a mix of parameters.
  struct runner {
    std::uint64_t id;
    std::vector<std::int32_t> prompt;
    std::size_t chunk;
    std::size_t start;
    runtime::sampling params;
    std::size_t pos = 0;
    std::int32_t last = -1;
  };
  std::vector<runner> rs;
  rs.push_back({1, a, a.size(), 0, {.temperature = 0.0, .top_logprobs = 0}});
  for (std::uint64_t k = 0; k < 7; ++k)
    rs.push_back({2 + k, prompt(9 + 6 * k, 10 + static_cast<std::uint32_t>(k)), 8, k,
                  {.temperature = k % 2 == 0 ? 0.0 : 0.8, .top_k = 20, .seed = k}});
  std::vector<std::int32_t> batched;
  std::size_t with_others = 0, beside_prefill = 0;
  for (std::size_t k = 0; batched.size() < n; ++k) {
    std::vector<runtime::step_sequence> batch;
    std::vector<runner*> in;
    bool prefilling = false;
    for (auto& r : rs) {
      if (k < r.start)
        continue;
      if (r.pos < r.prompt.size()) {
        const auto end = std::min(r.prompt.size(), r.pos + r.chunk);
        batch.push_back(seq(r.id, r.pos, slice(r.prompt, r.pos, end), end == r.prompt.size(),
                            r.params));
        prefilling = prefilling || r.id != 1;
      } else {
        batch.push_back(seq(r.id, r.pos, {r.last}, true, r.params));
      }
      in.push_back(&r);
    }
    // Sequence 1's row moves around the batch from step to step.
    std::rotate(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(k % batch.size()),
                batch.end());
    std::rotate(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(k % in.size()), in.end());
    with_others += batch.size() > 1 ? 1 : 0;
    beside_prefill += prefilling ? 1 : 0;
    auto r = run(dev, step(std::move(batch), k));
    REQUIRE_MESSAGE(r, sys.render(r.error()));
    std::size_t next = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      auto& x = *in[i];
      const std::size_t count = x.pos < x.prompt.size()
                                  ? std::min(x.prompt.size(), x.pos + x.chunk) - x.pos
                                  : 1;
      const bool sampled = x.pos + count >= x.prompt.size();
      x.pos += count;
      if (!sampled)
        continue;
      REQUIRE(next < r->sampled.size());
      CHECK(r->sampled[next].sequence == x.id); // results in batch order
      x.last = r->sampled[next].token;
      if (x.id == 1) {
        batched.push_back(x.last);
        batched_logprobs.push_back(r->sampled[next].logprob);
      }
      ++next;
    }
    CHECK(next == r->sampled.size());
  }
  CHECK(with_others >= n - 1);
  CHECK(beside_prefill >= 3);
  CHECK(batched == alone);
  CHECK(batched_logprobs == alone_logprobs); // bitwise: the logits did not change either
}

TEST_CASE_FIXTURE(device_fixture,
                  "a prompt prefilled in chunks decodes as when prefilled at once") {
  auto dev = cpu(tiny_params());
  const auto pr = prompt(37, 3);
  std::vector<float> once_logprobs, chunked_logprobs;
  const auto once = greedy(dev, 1, pr, 8, &once_logprobs);
  auto r = run(dev, step({seq(2, 0, slice(pr, 0, 5), false)}));
  REQUIRE(r);
  CHECK(r->sampled.empty()); // nothing asked for a token
  REQUIRE(run(dev, step({seq(2, 5, slice(pr, 5, 17), false)})));
  const runtime::sampling greedy_lp{.temperature = 0, .top_logprobs = 0};
  const auto first = sampled(dev, step({seq(2, 17, slice(pr, 17, 37), true, greedy_lp)}));
  chunked_logprobs.push_back(first.logprob);
  auto chunked = continue_greedy(dev, 2, 37, first.token, 7, &chunked_logprobs);
  chunked.insert(chunked.begin(), first.token);
  CHECK(chunked == once);
  CHECK(chunked_logprobs == once_logprobs); // bitwise
}

TEST_CASE_FIXTURE(device_fixture,
                  "a step with a wrong position is refused and leaves every cache as it was") {
  auto dev = cpu(tiny_params());
  const auto pr = prompt(10, 4);
  const auto t = token(dev, step({seq(1, 0, pr)}));
  // Sequence 1 holds 10 tokens: position 5 is wrong, and so is a new sequence not at 0. The
  // valid sequence 2 in the same batch must not be opened either.
  CHECK(is_error(run(dev, step({seq(1, 5, {t})})), device_errc::invalid_step));
  CHECK(is_error(run(dev, step({seq(2, 0, pr), seq(1, 11, {t})})), device_errc::invalid_step));
  CHECK(is_error(run(dev, step({seq(3, 4, pr)})), device_errc::invalid_step));
  CHECK(is_error(run(dev, step({seq(2, 10, {t})})), device_errc::invalid_step));
  // Other malformed steps: a token out of the vocabulary, a count that is not the tokens'.
  CHECK(is_error(run(dev, step({seq(1, 10, {256})})), device_errc::invalid_step));
  auto bad = seq(1, 10, {t});
  bad.count = 2;
  CHECK(is_error(run(dev, step({bad})), device_errc::invalid_step));
  // The next correct step works and gives what an untouched sequence gives.
  const auto after = token(dev, step({seq(1, 10, {t})}));
  REQUIRE(token(dev, step({seq(4, 0, pr)})) == t);
  CHECK(after == token(dev, step({seq(4, 10, {t})})));
  CHECK(token(dev, step({seq(2, 0, pr)})) == t); // 2 opens cleanly at position 0
}

TEST_CASE_FIXTURE(device_fixture, "seeded sampling is reproducible and differs across seeds") {
  auto dev = cpu(tiny_params());
  const auto pr = prompt(12, 5);
  const runtime::sampling seven{.temperature = 1.0, .seed = 7};
  const runtime::sampling eight{.temperature = 1.0, .seed = 8};
  // Sequences 1 and 2 share prompt and seed, 3 has another seed; all decode in one batch.
  std::vector<std::vector<std::int32_t>> out(3);
  auto r = run(dev, step({seq(1, 0, pr, true, seven), seq(2, 0, pr, true, seven),
                          seq(3, 0, pr, true, eight)}));
  for (std::size_t i = 0; i < 16; ++i) {
    REQUIRE_MESSAGE(r, sys.render(r.error()));
    REQUIRE(r->sampled.size() == 3);
    for (std::size_t s = 0; s < 3; ++s)
      out[s].push_back(r->sampled[s].token);
    const auto pos = pr.size() + i;
    r = run(dev, step({seq(1, pos, {out[0].back()}, true, seven),
                       seq(2, pos, {out[1].back()}, true, seven),
                       seq(3, pos, {out[2].back()}, true, eight)}));
  }
  CHECK(out[0] == out[1]);
  CHECK(out[0] != out[2]);
  // A draw depends on (seed, position) only: the same request alone draws the same tokens.
  auto alone = token(dev, step({seq(4, 0, pr, true, seven)}));
  CHECK(alone == out[0][0]);
}

TEST_CASE_FIXTURE(device_fixture,
                  "logprobs are the log-softmax of the raw logits with sorted top alternatives") {
  auto dev = cpu(tiny_params());
  const auto pr = prompt(15, 6);
  const auto ref = log_softmax_after(load_tiny({.batch_invariant = true}), pr);
  SUBCASE("greedy with five alternatives") {
    auto r = run(dev, step({seq(1, 0, pr, true, {.temperature = 0.0, .top_logprobs = 5})}));
    REQUIRE(r);
    const auto& t = r->sampled.at(0);
    CHECK(t.token == std::max_element(ref.begin(), ref.end()) - ref.begin());
    CHECK(t.logprob == doctest::Approx(ref[static_cast<std::size_t>(t.token)]).epsilon(1e-5));
    REQUIRE(t.top.size() == 5);
    CHECK(t.top[0].first == t.token);
    CHECK(t.top[0].second == t.logprob);
    for (std::size_t i = 0; i < t.top.size(); ++i) {
      const auto [id, lp] = t.top[i];
      CHECK(lp == doctest::Approx(ref[static_cast<std::size_t>(id)]).epsilon(1e-5));
      if (i > 0)
        CHECK(lp <= t.top[i - 1].second);
    }
    // No token outside the top five is more likely than the fifth.
    for (std::size_t id = 0; id < ref.size(); ++id)
      if (std::none_of(t.top.begin(), t.top.end(),
                       [&](auto p) { return p.first == static_cast<std::int32_t>(id); }))
        CHECK(ref[id] <= ref[static_cast<std::size_t>(t.top.back().first)] + 1e-6);
  }
  SUBCASE("a sampled token's logprob ignores the temperature, as vLLM reports it") {
    auto r = run(dev, step({seq(1, 0, pr, true,
                                {.temperature = 2.0, .seed = 3, .top_logprobs = 0})}));
    REQUIRE(r);
    const auto& t = r->sampled.at(0);
    CHECK(t.top.empty());
    CHECK(t.logprob == doctest::Approx(ref[static_cast<std::size_t>(t.token)]).epsilon(1e-5));
  }
  SUBCASE("no logprobs unless asked") {
    auto r = run(dev, step({seq(1, 0, pr)}));
    REQUIRE(r);
    CHECK(r->sampled.at(0).logprob == 0.0f);
    CHECK(r->sampled.at(0).top.empty());
  }
}

TEST_CASE_FIXTURE(device_fixture, "a released sequence is gone and reopens cleanly at position 0") {
  auto dev = cpu(tiny_params());
  const auto pr = prompt(10, 7);
  const auto t = token(dev, step({seq(1, 0, pr)}));
  self->send(dev, runtime::device_release{1});
  self->send(dev, runtime::device_release{42}); // unknown: ignored
  CHECK(is_error(run(dev, step({seq(1, 10, {t})})), device_errc::invalid_step));
  CHECK(token(dev, step({seq(1, 0, pr)})) == t);
}

TEST_CASE_FIXTURE(device_fixture,
                  "steps sent before the previous one's tokens are known feed those tokens") {
  // Overlapped scheduling: every step after the first is sent at once, each feeding the token
  // its predecessor draws (feed_drawn), beside a sequence that feeds its own ids.
  auto dev = cpu(tiny_params());
  const auto pr = prompt(20, 3);
  const auto other = prompt(9, 4);
  const auto want = greedy(dev, 1, pr, 8);
  const auto want_other = greedy(dev, 2, other, 1);
  self->send(dev, runtime::device_release{1});
  self->send(dev, runtime::device_release{2});
  self->send(dev, step({seq(1, 0, pr)}, 1));
  for (std::uint64_t k = 1; k < want.size(); ++k) {
    auto s = seq(1, pr.size() + k - 1, {0});
    s.feed_drawn = true;
    std::vector<runtime::step_sequence> batch{s};
    if (k == 3)
      batch.push_back(seq(2, 0, other));
    self->send(dev, step(std::move(batch), k + 1));
  }
  std::vector<std::int32_t> got, got_other;
  for (std::size_t k = 0; k < want.size(); ++k)
    self->receive([&](runtime::device_result& r) {
      CHECK(r.id == k + 1);
      for (const auto& t : r.sampled)
        (t.sequence == 1 ? got : got_other).push_back(t.token);
    });
  CHECK(got == want);
  CHECK(got_other == want_other);
  // A sequence the device has drawn nothing for has no token to feed.
  auto s = seq(7, 0, {5});
  s.feed_drawn = true;
  CHECK(is_error(run(dev, step({s}, 20)), device_errc::invalid_step));
  auto p = seq(8, 0, pr, false);  // a prefill chunk draws nothing either
  CHECK(run(dev, step({p}, 21)));
  auto q = seq(8, pr.size(), {0});
  q.feed_drawn = true;
  CHECK(is_error(run(dev, step({q}, 22)), device_errc::invalid_step));
}

TEST_CASE_FIXTURE(device_fixture,
                  "a sequence exported from one device continues on another with the same tokens") {
  auto a = cpu(tiny_params());
  auto b = cpu(tiny_params());
  const auto pr = prompt(150, 8); // one full 128-token block and a partial one
  const auto first = greedy(a, 1, pr, 3);
  auto snap = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_export{1});
  REQUIRE_MESSAGE(snap, sys.render(snap.error()));
  REQUIRE(*snap != nullptr);
  CHECK((*snap)->length == 152);
  CHECK((*snap)->blocks.size() == 1);
  CHECK_FALSE((*snap)->state.bytes.empty());
  CHECK_FALSE((*snap)->swa.bytes.empty());
  auto ok = ask<caf::ok_atom>(b, runtime::kv_import{5, *snap});
  REQUIRE_MESSAGE(ok, sys.render(ok.error()));
  std::vector<float> lp_a, lp_b;
  const auto on_b = continue_greedy(b, 5, 152, first.back(), 6, &lp_b);
  const auto on_a = continue_greedy(a, 1, 152, first.back(), 6, &lp_a);
  CHECK(on_b == on_a);
  CHECK(lp_b == lp_a); // bitwise: the restored cache is the exported one
  // The importing device holds the sequence: a second import of it is refused.
  auto again = ask<caf::ok_atom>(b, runtime::kv_import{5, *snap});
  CHECK((!again && runtime::is(again.error(), device_errc::snapshot_rejected)));
}

TEST_CASE_FIXTURE(device_fixture,
                  "a snapshot with a corrupted byte is refused and leaves no sequence behind") {
  auto a = cpu(tiny_params());
  auto b = cpu(tiny_params());
  const auto pr = prompt(140, 9);
  const auto t = token(a, step({seq(1, 0, pr)}));
  auto snap = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_export{1});
  REQUIRE(snap);
  auto import = [&](runtime::kv_snapshot s) {
    return ask<caf::ok_atom>(b, runtime::kv_import{5, std::make_shared<const runtime::kv_snapshot>(
                                                        std::move(s))});
  };
  auto refused = [](const caf::expected<caf::ok_atom>& r) {
    return !r && runtime::is(r.error(), device_errc::snapshot_rejected);
  };
  auto corrupt = **snap;
  corrupt.blocks.at(0).bytes[100] ^= 0x10;
  CHECK(refused(import(corrupt))); // the snapshot's checksum
  auto& bytes = corrupt.blocks.at(0).bytes;
  corrupt.blocks.at(0).checksum = XXH3_64bits(bytes.data(), bytes.size());
  CHECK(refused(import(corrupt))); // the block frame's own checksum
  auto swa = **snap;
  swa.swa.bytes[swa.swa.bytes.size() / 2] ^= 0x01;
  swa.swa.checksum = XXH3_64bits(swa.swa.bytes.data(), swa.swa.bytes.size());
  CHECK(refused(import(swa))); // found after blocks and state were restored
  auto truncated = **snap;
  truncated.blocks.clear();
  CHECK(refused(import(truncated)));
  // No sequence 5 on b: it is neither exportable nor at position 140, and opens at 0.
  auto gone = ask<runtime::kv_snapshot_ptr>(b, runtime::kv_export{5});
  CHECK((!gone && runtime::is(gone.error(), device_errc::unknown_sequence)));
  CHECK(is_error(run(b, step({seq(5, 140, {t})})), device_errc::invalid_step));
  CHECK(token(b, step({seq(5, 0, pr)})) == t);
}

TEST_CASE_FIXTURE(device_fixture,
                  "a prefix restored with the window state another device kept continues as "
                  "there; a copy that does not fit is ignored and the prefix replayed") {
  auto a = cpu(tiny_params());
  auto b = cpu(tiny_params());
  const auto pr = prompt(300, 12);  // two full blocks and 44 ids
  const std::vector<std::int32_t> head(pr.begin(), pr.begin() + 256);
  const std::vector<std::int32_t> tail(pr.begin() + 256, pr.end());
  const runtime::store_key key{0x1234, 0x5678};
  // a computes the first two blocks and keeps the window state there, as a prefill instance
  // does at a prompt's last block boundary; its blocks are what the store would serve.
  REQUIRE(run(a, step({seq(1, 0, head, false)})));
  self->send(a, runtime::kv_keep{1, key, 256});
  auto blocks = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_export{1, 0, true});
  REQUIRE(blocks);
  REQUIRE((*blocks)->blocks.size() == 2);
  auto kept = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_kept_export{key, 256});
  REQUIRE_MESSAGE(kept, sys.render(kept.error()));
  CHECK((*kept)->length == 256);
  CHECK((*kept)->blocks.empty());
  CHECK_FALSE((*kept)->swa.bytes.empty());
  // None at another length or under another key.
  auto other_length = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_kept_export{key, 128});
  CHECK((!other_length && runtime::is(other_length.error(), device_errc::unknown_sequence)));
  auto other_key = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_kept_export{{1, 2}, 256});
  CHECK((!other_key && runtime::is(other_key.error(), device_errc::unknown_sequence)));

  // The rest of the prompt and four tokens on a: what b must give.
  std::vector<float> lp_a, lp_b;
  const auto first_a = token(a, step({seq(1, 256, tail)}));
  const auto on_a = continue_greedy(a, 1, 300, first_a, 4, &lp_a);
  auto restore = [&](std::uint64_t id, runtime::kv_snapshot_ptr copy) {
    auto r = ask<runtime::kv_restored>(b, runtime::kv_restore{id, *blocks, key, head,
                                                              std::move(copy)});
    REQUIRE_MESSAGE(r, sys.render(r.error()));
    CHECK(r->length == 256);
    return *r;
  };
  // b keeps nothing of its own: with a's copy the restore is exact.
  auto pulled = restore(5, *kept);
  CHECK(pulled.pulled);
  CHECK_FALSE(pulled.replayed);
  const auto first_b = token(b, step({seq(5, 256, tail)}));
  const auto on_b = continue_greedy(b, 5, 300, first_b, 4, &lp_b);
  CHECK(first_b == first_a);
  CHECK(on_b == on_a);
  CHECK(lp_b == lp_a);  // bitwise: the same cache as a's

  // A copy whose bytes were changed in transit, one of another length, one of another model's:
  // ignored, the window replayed.
  auto corrupt = **kept;
  corrupt.swa.bytes[corrupt.swa.bytes.size() / 2] ^= 0x01;
  auto shorter = **kept;
  shorter.length = 128;
  auto foreign = **kept;
  foreign.model = "another model";
  std::uint64_t id = 6;
  for (auto* copy : {&corrupt, &shorter, &foreign}) {
    auto r = restore(id++, std::make_shared<const runtime::kv_snapshot>(*copy));
    CHECK(r.replayed);
    CHECK_FALSE(r.pulled);
  }
  auto none = restore(id, nullptr);
  CHECK(none.replayed);
  CHECK_FALSE(none.pulled);
}

TEST_CASE_FIXTURE(device_fixture,
                  "a decode step that ends on a block boundary sets the window state aside for "
                  "a kv_keep that comes after the next step; restored elsewhere it is exact") {
  auto a = cpu(tiny_params());
  auto b = cpu(tiny_params());
  const runtime::sampling greedy_lp{.temperature = 0.0, .top_logprobs = 0};
  const runtime::store_key key{0xabc, 0xdef};
  // Sequence 1 on a: a 250-token prompt, then decode steps that keep (as a decode engine's do
  // with a store); sequence 2 the same without keeping. `held` is what 1's cache holds.
  auto held = prompt(250, 13);
  auto last = token(a, step({seq(1, 0, held)}));
  REQUIRE(run(a, step({seq(2, 0, held)})));
  auto decode = [&](std::uint64_t id, bool keep) {
    auto s = seq(id, held.size(), {last}, true, greedy_lp);
    s.keep = keep;
    auto t = sampled(a, step({s}));
    return t;
  };
  while (held.size() < 256) {  // the step feeding token 256 ends on the boundary
    auto t = decode(1, true);
    REQUIRE(run(a, step({seq(2, held.size(), {last})})));
    held.push_back(last);
    last = t.token;
  }
  // One more step (as overlapped scheduling sends it) before the engine knows the block's key.
  auto t = decode(1, true);
  REQUIRE(run(a, step({seq(2, held.size(), {last})})));
  held.push_back(last);
  last = t.token;
  self->send(a, runtime::kv_keep{1, key, 256});
  self->send(a, runtime::kv_keep{2, {0xabc, 0x1}, 256});  // never set aside: nothing kept
  self->send(a, runtime::kv_keep{1, {0xabc, 0x2}, 384});  // not reached: nothing kept
  auto kept = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_kept_export{key, 256});
  REQUIRE_MESSAGE(kept, sys.render(kept.error()));
  CHECK((*kept)->length == 256);
  for (auto [k, length] : {std::pair{runtime::store_key{0xabc, 0x1}, 256},
                           std::pair{runtime::store_key{0xabc, 0x2}, 384}}) {
    auto none = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_kept_export{k, std::uint64_t(length)});
    CHECK((!none && runtime::is(none.error(), device_errc::unknown_sequence)));
  }
  // b opens the same 256 tokens from a's blocks and that copy, then feeds what a fed after
  // them: the same tokens and logprobs, bitwise.
  auto blocks = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_export{1, 0, true});
  REQUIRE(blocks);
  auto first_two = **blocks;
  first_two.blocks.resize(2);
  first_two.length = 256;
  const std::vector<std::int32_t> head(held.begin(), held.begin() + 256);
  auto r = ask<runtime::kv_restored>(
    b, runtime::kv_restore{5, std::make_shared<const runtime::kv_snapshot>(first_two), key, head,
                           *kept});
  REQUIRE_MESSAGE(r, sys.render(r.error()));
  CHECK(r->pulled);
  auto again = sampled(b, step({seq(5, 256, {held[256]}, true, greedy_lp)}));
  CHECK(again.token == last);
  CHECK(again.logprob == t.logprob);
  std::vector<float> lp_a, lp_b;
  const auto on_a = continue_greedy(a, 1, 257, last, 4, &lp_a);
  const auto on_b = continue_greedy(b, 5, 257, last, 4, &lp_b);
  CHECK(on_b == on_a);
  CHECK(lp_b == lp_a);

  // The sequence's next boundary replaces its copy at 256 (a later prompt mostly matches the
  // whole reply); the newest copy outlives the sequence's release.
  held.push_back(last);
  held.insert(held.end(), on_a.begin(), on_a.end() - 1);
  last = on_a.back();
  while (held.size() < 384) {
    auto n = decode(1, true);
    held.push_back(last);
    last = n.token;
  }
  const runtime::store_key next{0xabc, 0x384};
  self->send(a, runtime::kv_keep{1, next, 384});
  self->send(a, runtime::device_release{1});
  auto newest = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_kept_export{next, 384});
  REQUIRE_MESSAGE(newest, sys.render(newest.error()));
  auto replaced = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_kept_export{key, 256});
  CHECK((!replaced && runtime::is(replaced.error(), device_errc::unknown_sequence)));
}

TEST_CASE_FIXTURE(device_fixture,
                  "kept window states stay within keep_bytes: the least recently used go first, "
                  "and the gauges show what is kept") {
  // One block of a prompt on a sequence, kept under `key`.
  auto keep_one = [&](const runtime::device_port& d, std::uint64_t id, runtime::store_key key) {
    REQUIRE(run(d, step({seq(id, 0, prompt(128, static_cast<std::uint32_t>(id)), false)})));
    self->send(d, runtime::kv_keep{id, key, 128});
  };
  auto kept = [&](const runtime::device_port& d, runtime::store_key key) {
    return static_cast<bool>(ask<runtime::kv_snapshot_ptr>(d, runtime::kv_kept_export{key, 128}));
  };
  // What one copy takes, on a device that keeps as much as it likes.
  auto probe = cpu(tiny_params());
  keep_one(probe, 1, {1, 1});
  auto copy = ask<runtime::kv_snapshot_ptr>(probe, runtime::kv_kept_export{{1, 1}, 128});
  REQUIRE(copy);
  const auto bytes = (*copy)->state.bytes.size() + (*copy)->swa.bytes.size();
  // Room for two and a half.
  runtime::registry metrics;
  auto p = tiny_params();
  p.keep_bytes = bytes * 5 / 2;
  p.metrics = &metrics;
  p.name = "d";
  auto d = cpu(std::move(p));
  keep_one(d, 1, {1, 1});
  keep_one(d, 2, {2, 2});
  CHECK(kept(d, {1, 1}));  // a use: {2, 2} is now the least recently used
  keep_one(d, 3, {3, 3});
  CHECK(kept(d, {1, 1}));
  CHECK_FALSE(kept(d, {2, 2}));
  CHECK(kept(d, {3, 3}));
  const auto text = metrics.expose();
  CHECK(text.find(R"(troupe_device_kept_states{device="d"} 2)") != std::string::npos);
  CHECK(text.find("troupe_device_kept_bytes{device=\"d\"} " + std::to_string(2 * bytes) + "\n")
        != std::string::npos);
}

TEST_CASE_FIXTURE(device_fixture, "a snapshot of another model is refused") {
  CHECK(*ports::model_fingerprint(model_dirs::tiny(11))
        == *ports::model_fingerprint(model_dirs::tiny(11)));
  CHECK(*ports::model_fingerprint(model_dirs::tiny(11))
        != *ports::model_fingerprint(model_dirs::tiny(12)));
  auto a = cpu(tiny_params(11));
  auto other = cpu(tiny_params(12)); // same shapes, other weights
  REQUIRE(token(a, step({seq(1, 0, prompt(20, 10))})) >= 0);
  auto snap = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_export{1});
  REQUIRE(snap);
  auto r = ask<caf::ok_atom>(other, runtime::kv_import{1, *snap});
  REQUIRE_FALSE(r);
  CHECK(runtime::is(r.error(), device_errc::snapshot_rejected));
  CHECK(is_error(run(other, step({seq(1, 20, {3})})), device_errc::invalid_step));
}

TEST_CASE_FIXTURE(device_fixture, "a device whose model fails to load answers with the error") {
  ports::cpu_device_params p;
  p.model_dir = "/nonexistent/troupe-model";
  auto dev = cpu(std::move(p));
  auto r = run(dev, step({seq(1, 0, {3, 4})}));
  REQUIRE_FALSE(r);
  CHECK(runtime::is(r.error(), device_errc::load_failed));
  auto x = ask<runtime::kv_snapshot_ptr>(dev, runtime::kv_export{1});
  CHECK((!x && runtime::is(x.error(), device_errc::load_failed)));
}

TEST_CASE_FIXTURE(device_fixture, "an Engram model without its token map does not load") {
  auto p = tiny_params();
  p.engram_map.clear();
  auto dev = cpu(std::move(p));
  auto r = run(dev, step({seq(1, 0, {3, 4})}));
  REQUIRE_FALSE(r);
  CHECK(runtime::is(r.error(), device_errc::load_failed));
}

TEST_CASE_FIXTURE(device_fixture, "a CPU device runs on a model loaded by its caller") {
  const auto pr = prompt(9, 11);
  const auto want = greedy(cpu(tiny_params()), 1, pr, 4);
  ports::cpu_device_params p;
  p.model = load_tiny({.batch_invariant = true});
  auto dev = cpu(std::move(p));
  CHECK(greedy(dev, 1, pr, 4) == want);
}

TEST_CASE_FIXTURE(device_fixture, "a CPU device runs its instance's ranks as an EP group: the "
                                  "tokens of one model, and it stops when a rank fails") {
  const auto pr = prompt(19, 4);
  const auto want = greedy(cpu(tiny_params()), 1, pr, 6);
  for (std::uint32_t ranks : {2u, 3u}) {
    auto p = tiny_params();
    p.ep_ranks = ranks;
    CHECK(greedy(cpu(std::move(p)), 1, pr, 6) == want);
  }
  auto too_many = tiny_params();
  too_many.ep_ranks = 9;  // the tiny model has 8 routed experts
  auto r = run(cpu(std::move(too_many)), step({seq(1, 0, pr)}));
  REQUIRE_FALSE(r);
  CHECK(sys.render(r.error()).find("an EP group of 9 ranks") != std::string::npos);

  // Rank 1 of a 2-rank group fails in its 12th MoE (the second step): the step is answered
  // with the group's failure and the device stops, so the ranks watching it take its instance
  // down and it re-forms.
  auto failing = tiny_params();
  failing.backend = [dir = failing.model_dir](kernels::model) {
    return kernels::open_ep_group(
      dir, {.threads = 1, .batch_invariant = true}, *kernels::place_experts(8, 2),
      [](kernels::model& m) {
        return m.set_engram_token_map(*kernels::load_engram_token_map(m, "identity"));
      },
      std::make_shared<kernels::testing::failing_exchange>(2, 1, 12));
  };
  auto dev = cpu(std::move(failing));
  self->monitor(dev);
  const auto first = token(dev, step({seq(1, 0, pr)}));
  CHECK(first == want[0]);
  r = run(dev, step({seq(1, pr.size(), {first})}));
  REQUIRE_FALSE(r);
  CHECK(sys.render(r.error()).find("the EP group failed: rank 1: rank 1's device failed")
        != std::string::npos);
  bool down = false;
  self->receive([&](caf::down_msg& d) {
    down = true;
    CHECK(sys.render(d.reason).find("the EP group failed") != std::string::npos);
  }, caf::after(std::chrono::seconds(30)) >> [] {});
  CHECK(down);
}

namespace {

// The `troupe ep-rank` processes this test process started.
std::vector<pid_t> rank_processes_here() {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream stat(e.path() / "stat"), cmd(e.path() / "cmdline");
    std::string pid, comm, state, ppid, args;
    if (!(stat >> pid >> comm >> state >> ppid) || std::stol(ppid) != ::getpid())
      continue;
    std::getline(cmd, args, '\0');
    std::getline(cmd, args, '\0');
    if (args == "ep-rank")
      out.push_back(static_cast<pid_t>(std::stol(pid)));
  }
  return out;
}

} // namespace

TEST_CASE_FIXTURE(device_fixture, "a CPU device runs an EP group's ranks in processes of their "
                                  "own, and stops, saying how many ranks it lost, when one dies") {
  const auto pr = prompt(19, 4);
  const auto want = greedy(cpu(tiny_params()), 1, pr, 6);
  auto lost = std::make_shared<std::atomic<std::uint32_t>>(0);
  auto p = tiny_params();
  p.ep_ranks = 4;
  p.ranks_per_process = 2;  // ranks 0, 1 here; 2, 3 in one process
  p.rank_program = TROUPE_PROGRAM;
  p.on_ranks_lost = [lost](std::uint32_t n) { *lost += n; };
  auto dev = cpu(std::move(p));
  self->monitor(dev);
  CHECK(greedy(dev, 1, pr, 6) == want);
  const auto peers = rank_processes_here();
  REQUIRE(peers.size() == 1);
  // What a launcher's fault finds the process of a GPU's rank by.
  CHECK(ports::find_rank_process(::getpid(), 2) == peers[0]);
  CHECK(ports::find_rank_process(::getpid(), 3) == peers[0]);
  CHECK_FALSE(ports::find_rank_process(::getpid(), 1));
  CHECK_FALSE(ports::find_rank_process(::getppid(), 2));
  // Idle, the device finds out by itself (no step has to fail first).
  REQUIRE(::kill(peers[0], SIGKILL) == 0);
  bool down = false;
  self->receive([&](caf::down_msg& d) {
    down = true;
    CHECK(sys.render(d.reason).find("the EP group lost ranks: the process of ranks 2, 3 (pid "
                                    + std::to_string(peers[0]) + ") was killed by SIGKILL")
          != std::string::npos);
  }, caf::after(std::chrono::seconds(30)) >> [] {});
  CHECK(down);
  CHECK(*lost == 2);
  CHECK(rank_processes_here().empty());  // reaped
  CHECK_FALSE(ports::find_rank_process(::getpid(), 2));

  // Three processes of one rank each give the same tokens; a program that cannot start is the
  // device's load error.
  auto single = tiny_params();
  single.ep_ranks = 4;
  single.ranks_per_process = 1;
  single.rank_program = TROUPE_PROGRAM;
  CHECK(greedy(cpu(std::move(single)), 1, pr, 6) == want);
  auto missing = tiny_params();
  missing.ep_ranks = 2;
  missing.ranks_per_process = 1;
  missing.rank_program = "/nonexistent/troupe";
  auto r = run(cpu(std::move(missing)), step({seq(1, 0, pr)}));
  REQUIRE_FALSE(r);
  CHECK(sys.render(r.error()).find("cannot start /nonexistent/troupe") != std::string::npos);

  // A rank process killed while the group loads: the device reports its ranks lost and stops
  // (re-forming cures it), where a load that failed for good leaves the device answering why.
  const auto script = std::filesystem::temp_directory_path() / "troupe-test-rank-dies.sh";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\nkill -9 $$\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  *lost = 0;
  auto dying = tiny_params();
  dying.ep_ranks = 3;
  dying.ranks_per_process = 2;
  dying.rank_program = script;
  dying.on_ranks_lost = [lost](std::uint32_t n) { *lost += n; };
  auto doomed = cpu(std::move(dying));
  self->monitor(doomed);
  down = false;
  self->receive([&](caf::down_msg& d) {
    down = true;
    CHECK(sys.render(d.reason).find("the process of rank 2 is gone") != std::string::npos);
  }, caf::after(std::chrono::seconds(30)) >> [] {});
  CHECK(down);
  CHECK(*lost == 1);
  std::filesystem::remove(script);
}

TEST_CASE_FIXTURE(device_fixture,
                  "expert placements switched between steps leave every token and logprob as is") {
  const auto model = load_tiny();
  const auto E = static_cast<std::int32_t>(model.text().n_routed_experts);
  const auto k = static_cast<std::uint64_t>(model.text().num_experts_per_tok);
  const auto layers = static_cast<std::uint64_t>(model.text().num_hidden_layers);
  const auto pr = prompt(21, 6);
  auto plain = cpu(tiny_params());
  std::vector<float> want_lp;
  const auto want = greedy(plain, 1, pr, 13, &want_lp);

  runtime::registry metrics;
  auto link = std::make_shared<ports::expert_link>(static_cast<std::size_t>(E));
  auto p = tiny_params();
  p.experts = link;
  p.metrics = &metrics;
  p.name = "d";
  auto dev = cpu(std::move(p));
  std::vector<float> lp;
  auto got = greedy(dev, 1, pr, 5, &lp);
  // What a balancer proposes: copies of the two busiest experts over 4 ranks, then 3 ranks.
  auto counts = link->totals();
  std::vector<std::int32_t> busiest(static_cast<std::size_t>(E));
  std::iota(busiest.begin(), busiest.end(), 0);
  std::stable_sort(busiest.begin(), busiest.end(),
                   [&](auto a, auto b) { return counts[std::size_t(a)] > counts[std::size_t(b)]; });
  link->propose(*kernels::place_experts(E, 4, std::span(busiest).first(2)));
  auto more = continue_greedy(dev, 1, pr.size() + 4, got.back(), 4, &lp);
  got.insert(got.end(), more.begin(), more.end());
  link->propose(*kernels::place_experts(E, 2));
  link->propose(*kernels::place_experts(E, 3, std::span(busiest).first(3)));  // the newest wins
  more = continue_greedy(dev, 1, pr.size() + 8, got.back(), 2, &lp);
  got.insert(got.end(), more.begin(), more.end());
  link->propose(*kernels::place_experts(E + 1, 2));  // a wrong one: refused, the last one kept
  more = continue_greedy(dev, 1, pr.size() + 10, got.back(), 2, &lp);
  got.insert(got.end(), more.begin(), more.end());
  CHECK(got == want);
  CHECK(lp == want_lp);
  // Every token of the prompt and of the 12 decode steps, k experts in every layer.
  const auto routed = link->totals();
  CHECK(std::accumulate(routed.begin(), routed.end(), std::uint64_t{0})
        == (pr.size() + 12) * k * layers);
  const auto text = metrics.expose();
  CHECK(text.find(R"(troupe_device_expert_placements_total{device="d",outcome="applied"} 2)")
        != std::string::npos);
  CHECK(text.find(R"(troupe_device_expert_placements_total{device="d",outcome="refused"} 1)")
        != std::string::npos);
  // The router's counts per expert, as the link got them.
  for (std::size_t e = 0; e < routed.size(); ++e) {
    const auto line = "troupe_device_expert_tokens_total{device=\"d\",expert=\"" +
                      std::to_string(e) + "\"} " + std::to_string(routed[e]) + "\n";
    CHECK(text.find(line) != std::string::npos);
  }
}

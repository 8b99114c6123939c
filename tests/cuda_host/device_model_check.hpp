// The CUDA forward pass (kernels/cuda/device_model.hpp) against the CPU engine on the same
// batches: prefill longer than the SWA ring, a decode step batched with another sequence's
// prefill, decode steps of two sequences, a chunk that wraps the ring inside one call, then
// greedy decoding. Shared by the emulated device's test (tests/cuda_host) and the GPU's
// (tests/cuda, bench/gpu_check.sh).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cuda/device_model.hpp"
#include "kernels/model.hpp"

namespace troupe::test {

struct forward_comparison {
  std::string error;        // a failure of either engine, or "" when both ran every call
  double max_abs = 0;       // the largest |device − CPU| over every logit of every call
  double max_logit = 0;     // the largest |CPU logit|, for scale
  std::int64_t calls = 0;
  std::int64_t rows = 0;              // logit rows compared
  std::int64_t argmax_differs = 0;    // rows whose argmax differs
  std::vector<std::int64_t> greedy_cpu, greedy_device;  // greedy continuations of one prompt
};

inline forward_comparison compare_with_cpu(const kernels::model& m,
                                           kernels::cuda::device_model& dev,
                                           std::int64_t greedy_steps) {
  using namespace troupe::kernels;
  forward_comparison out;
  const std::int64_t V = m.text().vocab_size;
  const std::int64_t ring = m.text().sliding_window + swa_rollback_tokens;
  std::uint64_t z = 0x9E3779B97F4A7C15ull;
  auto tokens = [&](std::int64_t n) {
    std::vector<std::int64_t> t(static_cast<std::size_t>(n));
    for (auto& v : t) {
      z ^= z << 13, z ^= z >> 7, z ^= z << 17;
      v = static_cast<std::int64_t>(z % static_cast<std::uint64_t>(V));
    }
    return t;
  };
  struct seq {
    sequence_cache cpu;
    sequence_id dev = 0;
  };
  auto open = [&](seq& s) {
    s.cpu = m.new_sequence();
    auto id = dev.open_sequence();
    if (!id) return id.error();
    s.dev = *id;
    return std::string();
  };
  auto argmax = [&](const float* row) {
    return static_cast<std::int64_t>(std::max_element(row, row + V) - row);
  };
  // One call on both engines with tokens for each sequence; the logits compared row by row.
  auto call = [&](std::vector<std::pair<seq*, std::vector<std::int64_t>>> parts,
                  std::vector<float>* cpu_logits = nullptr) {
    std::vector<sequence_input> ci;
    std::vector<step_input> di;
    for (auto& [s, t] : parts) {
      ci.push_back({&s->cpu, t});
      di.push_back({s->dev, t});
    }
    auto want = m.forward(ci);
    if (!want) return "CPU: " + want.error();
    auto got = dev.forward(di);
    if (!got) return "device: " + got.error();
    if (got->size() != want->size()) return std::string("device: logits of another size");
    ++out.calls;
    for (std::size_t i = 0; i < want->size(); ++i) {
      out.max_abs = std::max(out.max_abs, double(std::fabs((*got)[i] - (*want)[i])));
      out.max_logit = std::max(out.max_logit, double(std::fabs((*want)[i])));
    }
    for (std::size_t r = 0; r < want->size() / static_cast<std::size_t>(V); ++r, ++out.rows)
      if (argmax(want->data() + r * V) != argmax(got->data() + r * V)) ++out.argmax_differs;
    if (cpu_logits != nullptr) *cpu_logits = std::move(*want);
    return std::string();
  };

  seq a, b, c;
  for (seq* s : {&a, &b, &c})
    if (out.error = open(*s); !out.error.empty()) return out;
  const std::vector<std::vector<std::pair<seq*, std::vector<std::int64_t>>>> schedule = {
      {{&a, tokens(ring + 3)}},                      // a prefill the ring cannot hold whole
      {{&a, tokens(1)}, {&b, tokens(5)}},            // a decode step beside b's prefill
      {{&b, tokens(1)}, {&a, tokens(1)}},            // decode, the batch in another order
      {{&a, tokens(1)}, {&b, tokens(1)}},
      {{&b, tokens(ring + 2)}, {&a, tokens(2)}},     // a chunk that wraps b's ring in one call
      {{&a, tokens(1)}, {&b, tokens(1)}},
  };
  for (const auto& parts : schedule)
    if (out.error = call(parts); !out.error.empty()) return out;

  // Greedy: both engines continue c from the CPU's choice, and each records its own argmax.
  std::vector<std::int64_t> next = tokens(7);
  for (std::int64_t step = 0; step < greedy_steps; ++step) {
    std::vector<sequence_input> ci{{&c.cpu, next}};
    std::vector<step_input> di{{c.dev, next}};
    auto want = m.forward_last(ci);
    if (!want) return out.error = "CPU: " + want.error(), out;
    auto got = dev.forward(di);
    if (!got) return out.error = "device: " + got.error(), out;
    out.greedy_cpu.push_back(argmax(want->data()));
    out.greedy_device.push_back(argmax(got->data() + got->size() - static_cast<std::size_t>(V)));
    next = {out.greedy_cpu.back()};
  }
  return out;
}

/// A model without a tokenizer (a golden or a random preset) gets token id mod the compressed
/// vocabulary as its Engram token map; nothing for a model without Engram layers.
inline kernels::result<bool> set_identity_engram_map(kernels::model& m) {
  if (m.text().engram_layer_ids.empty()) return true;
  std::vector<std::int64_t> map(static_cast<std::size_t>(m.text().vocab_size));
  std::iota(map.begin(), map.end(), 0);
  for (auto& id : map) id %= m.text().engram_compressed_vocab_size;
  return m.set_engram_token_map(map);
}

/// compare_with_cpu, its figures as a MESSAGE, and the checks: logits within 1e-4 of the
/// largest, every argmax and every greedy token equal.
inline void check_against_cpu(const std::string& what, const kernels::model& m,
                              kernels::cuda::device_model& dev, std::int64_t greedy_steps) {
  const auto cmp = compare_with_cpu(m, dev, greedy_steps);
  REQUIRE_MESSAGE(cmp.error.empty(), cmp.error);
  MESSAGE(what << ": max |device - CPU| " << cmp.max_abs << " over " << cmp.rows
               << " rows (largest logit " << cmp.max_logit << "), greedy "
               << cmp.greedy_device.size() << " steps");
  CHECK(cmp.calls == 6);
  CHECK(cmp.max_abs <= 1e-4 * std::max(1.0, cmp.max_logit));
  CHECK(cmp.argmax_differs == 0);
  CHECK(cmp.greedy_device.size() == static_cast<std::size_t>(greedy_steps));
  CHECK(cmp.greedy_device == cmp.greedy_cpu);
}

/// One sequence's logit rows (its 20-token prompt's last, then three decode steps') run alone,
/// and again as prompt chunks of 7 and 13 beside another sequence's prefill and decode steps:
/// what batch-invariant mode must keep bitwise equal.
struct two_runs {
  std::vector<std::vector<float>> alone, batched;
};
inline two_runs alone_and_batched(const kernels::model& m, kernels::cuda::device_model& dev) {
  using namespace troupe::kernels;
  const std::int64_t V = m.text().vocab_size;
  std::vector<std::int64_t> prompt(20), other(9);
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<std::int64_t>((i * 7 + 3) % static_cast<std::size_t>(V));
  for (std::size_t i = 0; i < other.size(); ++i)
    other[i] = static_cast<std::int64_t>((i * 5 + 1) % static_cast<std::size_t>(V));
  const std::vector<std::int64_t> steps{9, 41, 17};
  auto row = [&](const std::vector<float>& logits, std::int64_t r) {
    return std::vector<float>(logits.begin() + r * V, logits.begin() + (r + 1) * V);
  };
  auto run = [&](std::vector<step_input> call) {
    auto l = dev.forward(call);
    REQUIRE_MESSAGE(l, l.error());
    return std::move(*l);
  };
  two_runs out;
  auto a = dev.open_sequence();
  REQUIRE(a);
  out.alone.push_back(row(run({{*a, prompt}}), 19));
  for (const auto t : steps) out.alone.push_back(run({{*a, std::span(&t, 1)}}));
  REQUIRE(dev.close_sequence(*a));
  a = dev.open_sequence();
  auto b = dev.open_sequence();
  REQUIRE(a);
  REQUIRE(b);
  run({{*b, other}, {*a, std::span(prompt).first(7)}});
  out.batched.push_back(row(run({{*a, std::span(prompt).subspan(7)}, {*b, std::span(other).first(1)}}), 12));
  for (const auto t : steps)
    out.batched.push_back(row(run({{*b, std::span(&t, 1)}, {*a, std::span(&t, 1)}}), 1));
  REQUIRE(dev.close_sequence(*a));
  REQUIRE(dev.close_sequence(*b));
  return out;
}

/// Speculative decoding's calls on the device and on the CPU engine side by side: a prompt,
/// then rounds of a chunk of 1 + k tokens (k = 1 .. 6) of which the last `rejected` are rolled
/// back (device_model::rollback against kernels::rollback), crossing CSA2 group boundaries;
/// every chunk's logits and the DSpark features of each call, then decode steps after the last
/// rollback. Returns the largest |device − CPU| logit and feature; fails on any error or on a
/// refusal that differs from the CPU's.
struct rollback_comparison {
  double max_logit_diff = 0, max_feature_diff = 0;
  std::int64_t rolled_back = 0;  // tokens undone
};

inline rollback_comparison compare_rollbacks(const kernels::model& m,
                                             kernels::cuda::device_model& dev) {
  using namespace troupe::kernels;
  rollback_comparison out;
  const std::int64_t V = m.text().vocab_size;
  auto cache = m.new_sequence();
  auto id = dev.open_sequence();
  REQUIRE_MESSAGE(id, id.error());
  auto diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0;
    for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
    return d;
  };
  std::uint64_t z = 0x51ED270B27ull;
  auto tokens = [&](std::int64_t n) {
    std::vector<std::int64_t> t(static_cast<std::size_t>(n));
    for (auto& v : t) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<std::int64_t>((z >> 33) % static_cast<std::uint64_t>(V));
    }
    return t;
  };
  auto both = [&](const std::vector<std::int64_t>& t) {
    std::vector<float> f_cpu, f_dev;
    const sequence_input ci{&cache, t};
    auto want = m.forward(std::span(&ci, 1), nullptr, &f_cpu);
    const step_input di{*id, t};
    auto got = dev.forward(std::span(&di, 1), &f_dev);
    REQUIRE_MESSAGE(want, want.error());
    REQUIRE_MESSAGE(got, got.error());
    out.max_logit_diff = std::max(out.max_logit_diff, diff(*got, *want));
    out.max_feature_diff = std::max(out.max_feature_diff, diff(f_dev, f_cpu));
  };
  both(tokens(21));
  for (std::int64_t round = 0; round < 12; ++round) {
    const std::int64_t k = 1 + round % 6, rejected = (round * 5) % (k + 1);
    both(tokens(1 + k));
    auto want = kernels::rollback(cache, rejected);
    auto got = dev.rollback(*id, rejected);
    REQUIRE_MESSAGE(want, want.error());
    REQUIRE_MESSAGE(got, got.error());
    out.rolled_back += rejected;
    auto length = dev.length(*id);
    REQUIRE(length);
    CHECK(*length == cache.length);
  }
  // What both refuse, with the same words: more than 6 tokens, and below the last rollback.
  CHECK(dev.rollback(*id, 7).error() == kernels::rollback(cache, 7).error());
  CHECK(dev.rollback(*id, 1).error() == kernels::rollback(cache, 1).error());
  for (int i = 0; i < 3; ++i) both(tokens(1));
  REQUIRE(dev.close_sequence(*id));
  return out;
}

/// compare_rollbacks on the model in `dir` (uploaded with one sequence), checked: 20 tokens or
/// more undone, logits and features within 1e-4 of the CPU engine's; the figures printed.
inline void check_rollbacks(const std::filesystem::path& dir) {
  CAPTURE(dir);
  auto m = kernels::model::load(dir);
  REQUIRE_MESSAGE(m, m.error());
  REQUIRE(set_identity_engram_map(*m));
  auto dev = kernels::cuda::device_model::upload(*m, {.max_sequences = 1});
  REQUIRE_MESSAGE(dev, dev.error());
  const auto r = compare_rollbacks(*m, *dev);
  MESSAGE(dir.filename().string() << ": " << r.rolled_back << " tokens rolled back; largest "
                                  << "|device - CPU| logit " << r.max_logit_diff << ", feature "
                                  << r.max_feature_diff);
  CHECK(r.rolled_back >= 20);
  CHECK(r.max_logit_diff < 1e-4);
  CHECK(r.max_feature_diff < 1e-4);
}

/// The DSpark draft layers on the device (device_model::draft) against the CPU engine's
/// (model::draft / extend_draft), both fed the CPU's features so that only the draft layers are
/// compared: a context longer than the draft ring extended without drafting, two sequences
/// drafted in one batch, drafted again after more features, one restarted at a position its
/// context does not end at; each context exported and compared row by row with the CPU's, then
/// imported into a fresh sequence, whose drafts must equal the original's bit for bit.
struct draft_comparison {
  double max_logit_diff = 0, max_confidence_diff = 0, max_context_diff = 0;
  std::int64_t drafts = 0, tokens_differ = 0;
};

inline draft_comparison compare_drafts(const kernels::model& m, kernels::cuda::device_model& dev) {
  using namespace troupe::kernels;
  REQUIRE(m.has_draft());
  REQUIRE(dev.has_draft());
  draft_comparison out;
  const auto& c = m.text();
  const std::int64_t V = c.vocab_size;
  const auto width = c.dspark_target_layer_ids.size() * static_cast<std::size_t>(c.hidden_size);
  const std::int64_t ring = c.sliding_window + swa_rollback_tokens;
  // Features of a real forward pass: a prompt longer than the draft ring.
  const std::int64_t n = ring + 12;
  std::vector<std::int64_t> prompt(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) prompt[static_cast<std::size_t>(i)] = (i * 29 + 3) % V;
  auto cache = m.new_sequence();
  std::vector<float> f;
  const sequence_input in{&cache, prompt};
  REQUIRE(m.forward(std::span(&in, 1), nullptr, &f));
  REQUIRE(f.size() == static_cast<std::size_t>(n) * width);
  auto rows = [&](std::int64_t first, std::int64_t count) {
    return std::span<const float>(f).subspan(static_cast<std::size_t>(first) * width,
                                             static_cast<std::size_t>(count) * width);
  };
  auto diff = [](const float* a, const float* b, std::size_t k) {
    double d = 0;
    for (std::size_t i = 0; i < k; ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
    return d;
  };
  auto compare = [&](const draft_output& got, const draft_output& want) {
    REQUIRE(got.tokens.size() == want.tokens.size());
    REQUIRE(got.logits.size() == want.logits.size());
    out.max_logit_diff = std::max(out.max_logit_diff,
                                  diff(got.logits.data(), want.logits.data(), got.logits.size()));
    out.max_confidence_diff =
        std::max(out.max_confidence_diff,
                 diff(got.confidences.data(), want.confidences.data(), got.confidences.size()));
    for (std::size_t i = 0; i < got.tokens.size(); ++i)
      out.tokens_differ += got.tokens[i] != want.tokens[i];
    out.drafts += static_cast<std::int64_t>(got.tokens.size());
  };
  auto s0 = m.new_draft_state(), s1 = m.new_draft_state();
  auto d0 = dev.open_sequence(), d1 = dev.open_sequence();
  REQUIRE(d0);
  REQUIRE(d1);
  // 1. A context extended without drafting, then two sequences drafted in one batch.
  const std::int64_t first = n - 10;
  REQUIRE(m.extend_draft(s0, rows(0, first)));
  const draft_request extend{*d0, 0, rows(0, first), -1};
  auto none = dev.draft(std::span(&extend, 1));
  REQUIRE_MESSAGE(none, none.error());
  CHECK(none->tokens.empty());
  auto round = [&](std::vector<draft_request> on_device, std::vector<draft_input> on_cpu) {
    auto got = dev.draft(on_device);
    auto want = m.draft(on_cpu);
    REQUIRE_MESSAGE(got, got.error());
    REQUIRE_MESSAGE(want, want.error());
    compare(*got, *want);
    return std::move(*got);
  };
  round({{*d0, first, rows(first, 10), 17}, {*d1, 0, rows(0, 9), 200}},
        {{&s0, rows(first, 10), 17}, {&s1, rows(0, 9), 200}});
  // 2. More features, as after a verify step.
  round({{*d0, n, rows(3, 3), 5}, {*d1, 9, rows(20, 2), 99}},
        {{&s0, rows(3, 3), 5}, {&s1, rows(20, 2), 99}});
  // 3. A position the context does not end at: it restarts there.
  s1.reset(50);
  round({{*d1, 50, rows(7, 4), 1}}, {{&s1, rows(7, 4), 1}});
  // 4. The contexts as the CPU holds them, and moved into a fresh sequence.
  for (const auto& [id, cpu] : {std::pair{*d0, &s0}, std::pair{*d1, &s1}}) {
    auto exported = dev.export_draft(id);
    REQUIRE_MESSAGE(exported, exported.error());
    REQUIRE(exported->has_value());
    const auto& got = **exported;
    REQUIRE(got.rings.size() == cpu->rings.size());
    for (std::size_t st = 0; st < got.rings.size(); ++st) {
      CHECK(got.rings[st].begin() == cpu->rings[st].begin());
      REQUIRE(got.rings[st].end() == cpu->rings[st].end());
      for (auto p = got.rings[st].begin(); p < got.rings[st].end(); ++p)
        out.max_context_diff =
            std::max(out.max_context_diff,
                     diff(got.rings[st].at(p), cpu->rings[st].at(p),
                          static_cast<std::size_t>(c.head_dim)));
    }
  }
  auto exported = dev.export_draft(*d0);
  REQUIRE(exported);
  auto d2 = dev.open_sequence();
  REQUIRE(d2);
  auto fresh = dev.export_draft(*d2);
  REQUIRE(fresh);
  CHECK_FALSE(fresh->has_value());  // no context until a draft call or an import
  REQUIRE(dev.import_draft(*d2, **exported));
  const std::int64_t at = n + 3;
  const draft_request a{*d0, at, rows(11, 2), 42}, b{*d2, at, rows(11, 2), 42};
  auto from_original = dev.draft(std::span(&a, 1));
  auto from_import = dev.draft(std::span(&b, 1));
  REQUIRE(from_original);
  REQUIRE(from_import);
  CHECK(from_import->tokens == from_original->tokens);
  CHECK(from_import->logits == from_original->logits);
  // What it refuses, changing no context.
  const draft_request narrow{*d0, at + 2, rows(0, 1).first(width - 1), 3};
  CHECK(dev.draft(std::span(&narrow, 1)).error() ==
        "draft: sequence 0: expected features of width " + std::to_string(width) +
            " (targets x hidden_size), found " + std::to_string(width - 1) + " values");
  const draft_request high{*d0, at + 2, {}, V};
  CHECK(dev.draft(std::span(&high, 1)).error() ==
        "draft: sequence 0: anchor token " + std::to_string(V) + ", expected 0 <= id < " +
            std::to_string(V));
  const draft_request twice[] = {{*d0, at + 2, {}, 1}, {*d0, at + 2, {}, 1}};
  CHECK(dev.draft(twice).error() ==
        "device_model: sequence " + std::to_string(*d0) + " twice in one batch");
  const draft_request unknown{999, 0, {}, 1};
  CHECK(dev.draft(std::span(&unknown, 1)).error() == "device_model: no sequence 999");
  auto after = dev.export_draft(*d0);
  REQUIRE(after);
  CHECK((*after)->length() == at + 2);
  for (auto id : {*d0, *d1, *d2}) REQUIRE(dev.close_sequence(id));
  return out;
}

/// compare_drafts on the tiny preset in `dir`, checked: every draft token equal, logits and
/// context rows within 1e-4 of the CPU engine's, confidences within 1e-5; the figures printed.
inline void check_drafts(const std::filesystem::path& dir) {
  auto m = kernels::model::load(dir);
  REQUIRE_MESSAGE(m, m.error());
  REQUIRE(set_identity_engram_map(*m));
  auto dev = kernels::cuda::device_model::upload(*m, {.max_sequences = 3});
  REQUIRE_MESSAGE(dev, dev.error());
  const auto r = compare_drafts(*m, *dev);
  MESSAGE("DSpark drafts on the device: " << r.drafts << " drafts, " << r.tokens_differ
                                          << " tokens differ; largest |device - CPU| logit "
                                          << r.max_logit_diff << ", confidence "
                                          << r.max_confidence_diff << ", context row "
                                          << r.max_context_diff);
  CHECK(r.drafts >= 5 * m->text().dspark_block_size);
  CHECK(r.tokens_differ == 0);
  CHECK(r.max_logit_diff < 1e-4);
  CHECK(r.max_confidence_diff < 1e-5);
  CHECK(r.max_context_diff < 1e-4);
}

}  // namespace troupe::test

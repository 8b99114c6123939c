// cuda_backend (kernels/cuda/cuda_backend.hpp) on the emulated device against cpu_backend: the
// same model_backend calls — steps, tails, KV exported from one and imported into the other,
// bounded replay — give the same logits to rounding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/model_init.hpp"
#include "tests/kernels/scratch.hpp"

using namespace troupe::kernels;

namespace {

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

// Each of `next` as one decode step of `id`, the logits of all of them.
std::vector<float> decode(model_backend& be, sequence_id id, const std::vector<std::int64_t>& next) {
  std::vector<float> out;
  for (const auto t : next) {
    const std::vector<std::int64_t> one{t};
    const step_input in{id, one};
    const std::int64_t rows = 1;
    auto l = be.step_tail(std::span(&in, 1), std::span(&rows, 1), nullptr);
    REQUIRE_MESSAGE(l, l.error());
    out.insert(out.end(), l->begin(), l->end());
  }
  return out;
}

// A new sequence on each backend prefilled with `prompt`, their logits compared; their ids.
std::pair<sequence_id, sequence_id> prefill_both(model_backend& cpu, model_backend& dev,
                                                 const std::vector<std::int64_t>& prompt) {
  const sequence_id c = cpu.open_sequence(), g = dev.open_sequence();
  const step_input ci{c, prompt}, gi{g, prompt};
  auto want = cpu.step(std::span(&ci, 1));
  auto got = dev.step(std::span(&gi, 1));
  REQUIRE(want);
  REQUIRE_MESSAGE(got, got.error());
  CHECK(max_diff(*got, *want) < 1e-4);
  return {c, g};
}

// A sequence of `to` rebuilt from `from`'s serialised Block KV, then State and SWA KV.
sequence_id move(const model_backend& from, sequence_id id, model_backend& to) {
  const sequence_id moved = to.open_sequence();
  auto blocks = from.full_blocks(id);
  REQUIRE(blocks);
  for (std::int64_t b = 0; b < *blocks; ++b) {
    auto bytes = from.export_block(id, b);
    REQUIRE(bytes);
    REQUIRE(to.import_block(moved, b, *bytes));
  }
  auto state = from.export_state(id);
  auto swa = from.export_swa(id);
  REQUIRE(state);
  REQUIRE(swa);
  REQUIRE(to.import_state(moved, *state));
  REQUIRE(to.import_swa(moved, *swa));
  return moved;
}

// The identity Engram map of the tiny preset.
std::vector<std::int64_t> identity_map() {
  std::vector<std::int64_t> identity(256);
  std::iota(identity.begin(), identity.end(), 0);
  return identity;
}

// The tiny preset in `dir`, loaded with the identity Engram map.
model tiny_model(const std::filesystem::path& dir) {
  auto m = model::load(dir);
  REQUIRE(m);
  REQUIRE(m->set_engram_token_map(identity_map()));
  return std::move(*m);
}

// The tiny preset (seed `seed`) in scratch directory `name`, served by cpu_backend and by a
// cuda_backend that holds `max_sequences` sequences on the device at once, and a pool of
// `kv_tokens` (0: the default) in pages of `page_tokens`.
struct side_by_side {
  cpu_backend cpu;
  std::unique_ptr<cuda::cuda_backend> gpu;
};

side_by_side tiny_backends(const std::string& name, std::uint64_t seed,
                           std::int64_t max_sequences, std::int64_t page_tokens = 256,
                           std::int64_t kv_tokens = 0) {
  const auto dir = testing::scratch_root() / name;
  REQUIRE(write_random_model(dir, "tiny", seed));
  cuda::cuda_backend_options options;
  options.max_sequences = max_sequences;
  options.page_tokens = page_tokens;
  options.kv_tokens = kv_tokens;
  auto gpu = cuda::cuda_backend::open(tiny_model(dir), options);
  REQUIRE_MESSAGE(gpu, gpu.error());
  return {cpu_backend(tiny_model(dir)), std::move(*gpu)};
}

}  // namespace

TEST_CASE("emulated device: cuda_backend serves as cpu_backend does, and KV moves between them") {
  const auto dir = testing::scratch_root() / "cuda-backend-tiny";
  REQUIRE(write_random_model(dir, "tiny", 5));
  cpu_backend cpu(tiny_model(dir));
  // Opened from the directory, the map given in the options.
  auto gpu =
      cuda::cuda_backend::open(dir, {.max_sequences = 4, .engram_token_map = identity_map()});
  REQUIRE_MESSAGE(gpu, gpu.error());
  auto& dev = **gpu;
  CHECK(dev.has_draft());  // the tiny preset has DSpark layers: they run on the device

  std::vector<std::int64_t> prompt(131), next{5, 77, 200, 13};
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int64_t>((i * 37 + 11) % 256);
  const auto [c, g] = prefill_both(cpu, dev, prompt);
  CHECK(*dev.length(g) == 131);
  CHECK(*dev.full_blocks(g) == *cpu.full_blocks(c));
  CHECK(*dev.full_blocks(g) == 1);

  // One pass through every case (each SUBCASE would run the prefill again: minutes on the
  // emulator). Sequences c and g move first; the decode steps then continue them.
  {  // device to CPU and CPU to device, through the serialised KV
    const auto reference = decode(cpu, move(cpu, c, cpu), next);
    const sequence_id to_cpu = move(dev, g, cpu);
    CHECK(max_diff(decode(cpu, to_cpu, next), reference) == 0);  // the cached rows are rounded
    const sequence_id to_dev = move(cpu, c, dev);
    CHECK(*dev.length(to_dev) == 131);
    CHECK(max_diff(decode(dev, to_dev, next), reference) < 1e-4);
  }
  {  // bounded replay of imported blocks
    auto block = cpu.export_block(c, 0);
    REQUIRE(block);
    const sequence_id rc = cpu.open_sequence(), rg = dev.open_sequence();
    REQUIRE(cpu.import_block(rc, 0, *block));
    REQUIRE(dev.import_block(rg, 0, *block));
    auto lc = cpu.replay(rc, prompt);
    auto lg = dev.replay(rg, prompt);
    REQUIRE(lc);
    REQUIRE_MESSAGE(lg, lg.error());
    CHECK(max_diff(*lg, *lc) == 0);  // both replays run on the CPU engine
    CHECK(max_diff(decode(dev, rg, next), decode(cpu, rc, next)) < 1e-4);
  }
  // Decode steps of the sequences that never moved.
  CHECK(max_diff(decode(dev, g, next), decode(cpu, c, next)) < 1e-4);
  {  // a verify step: the tail rows and the DSpark features, a rollback, drafts from them
    const std::vector<std::int64_t> chunk{17, 4, 250, 9};
    const std::int64_t rows = 3;
    const step_input ci{c, chunk}, gi{g, chunk};
    std::vector<float> f_cpu, f_dev;
    auto want = cpu.step_tail(std::span(&ci, 1), std::span(&rows, 1), &f_cpu);
    auto got = dev.step_tail(std::span(&gi, 1), std::span(&rows, 1), &f_dev);
    REQUIRE(want);
    REQUIRE_MESSAGE(got, got.error());
    CHECK(max_diff(*got, *want) < 1e-4);
    CHECK_FALSE(f_dev.empty());
    CHECK(max_diff(f_dev, f_cpu) < 1e-4);
    REQUIRE(cpu.rollback(c, 2));
    REQUIRE(dev.rollback(g, 2));
    CHECK(*dev.length(g) == *cpu.length(c));
    // Drafts from the first two tokens' features, anchored on the next token.
    const auto width = f_cpu.size() / chunk.size();
    const draft_request dc{c, *cpu.length(c) - 2, std::span(f_cpu).first(2 * width), 77};
    const draft_request dg{g, *dev.length(g) - 2, std::span(f_dev).first(2 * width), 77};
    auto d_cpu = cpu.draft(std::span(&dc, 1));
    auto d_dev = dev.draft(std::span(&dg, 1));
    REQUIRE_MESSAGE(d_cpu, d_cpu.error());
    REQUIRE_MESSAGE(d_dev, d_dev.error());
    CHECK(d_dev->tokens == d_cpu->tokens);
    CHECK_FALSE(dev.export_draft(g)->empty());
    CHECK(max_diff(decode(dev, g, next), decode(cpu, c, next)) < 1e-4);
    // An export after decode steps is of the sequence as it is then, not of the download an
    // export before them made.
    (void)move(dev, g, cpu);
    (void)decode(dev, g, next);
    const sequence_id again = move(dev, g, cpu);
    CHECK(*cpu.length(again) == *dev.length(g));
    CHECK(max_diff(decode(cpu, again, next), decode(dev, g, next)) < 1e-4);
  }
  {  // what it refuses
    CHECK(dev.rollback(g, 7).error() == "rollback: 7 tokens, expected 0 to 6");
    CHECK(dev.import_block(g, 0, "x").error() ==
          "backend: sequence 1 already ran tokens; blocks are imported into a fresh one");
    CHECK(dev.length(999).error() == "backend: no sequence 999");
    REQUIRE(dev.close_sequence(g));
    CHECK_FALSE(dev.close_sequence(g));
  }
}

TEST_CASE("emulated device: beyond max_sequences, the sequence that ran least recently waits on "
          "the host") {
  auto backends = tiny_backends("cuda-backend-evict", 7, 2);
  auto& cpu = backends.cpu;
  auto& dev = *backends.gpu;

  // Three sequences on a device that holds two: each prompt, then decode steps in an order
  // that moves one to the host at every step.
  std::vector<sequence_id> c, g;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::int64_t> prompt(9 + s);
    for (std::size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = static_cast<std::int64_t>((i * 53 + 7 * s + 1) % 256);
    const auto [cs, gs] = prefill_both(cpu, dev, prompt);
    c.push_back(cs);
    g.push_back(gs);
  }
  CHECK(dev.evictions() == 1);  // the third prompt moved the first sequence to the host
  for (const int s : {0, 1, 2, 0}) {
    const std::vector<std::int64_t> t{static_cast<std::int64_t>(s * 31 + 4)};
    CHECK(max_diff(decode(dev, g[s], t), decode(cpu, c[s], t)) < 1e-4);
  }
  CHECK(dev.evictions() == 5);
  {  // a batch of two: the third one is the one that waits
    const std::vector<std::int64_t> t1{9}, t2{10};
    const step_input ci[] = {{c[1], t1}, {c[2], t2}}, gi[] = {{g[1], t1}, {g[2], t2}};
    auto want = cpu.step(ci);
    auto got = dev.step(gi);
    REQUIRE_MESSAGE(got, got.error());
    CHECK(max_diff(*got, *want) < 1e-4);
    CHECK(dev.evictions() == 6);
  }
  {  // a batch larger than the device is refused, and every sequence goes on as before
    const std::vector<std::int64_t> t{3};
    const step_input all[] = {{g[0], t}, {g[1], t}, {g[2], t}};
    CHECK(dev.step(all).error() ==
          "cuda backend: a batch of 3 sequences, but the device holds 2 at once (max_sequences)");
    for (int s = 0; s < 3; ++s) {
      CHECK(*dev.length(g[s]) == *cpu.length(c[s]));
      CHECK(max_diff(decode(dev, g[s], t), decode(cpu, c[s], t)) < 1e-4);
    }
  }
}

TEST_CASE("emulated device: when a step needs more KV pages than are free, the sequence that "
          "ran least recently waits on the host") {
  // Room for four sequences but pages for 48 tokens (six of 8): three 14-token prompts take
  // two pages each, and the third sequence's decode steps need a third page at token 17.
  auto backends = tiny_backends("cuda-backend-pages", 7, 4, 8, 48);
  auto& cpu = backends.cpu;
  auto& dev = *backends.gpu;
  std::vector<sequence_id> c, g;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::int64_t> prompt(14);
    for (std::size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = static_cast<std::int64_t>((i * 29 + 5 * s + 2) % 256);
    const auto [cs, gs] = prefill_both(cpu, dev, prompt);
    c.push_back(cs);
    g.push_back(gs);
  }
  CHECK(dev.evictions() == 0);
  // Sequence 2 decodes to 17 tokens: its third page moves sequence 0 (run least recently) to
  // the host; then sequence 0 comes back in place of sequence 1.
  const std::vector<std::int64_t> t{40, 41, 42};
  CHECK(max_diff(decode(dev, g[2], t), decode(cpu, c[2], t)) < 1e-4);
  CHECK(dev.evictions() == 1);
  CHECK(max_diff(decode(dev, g[0], t), decode(cpu, c[0], t)) < 1e-4);
  CHECK(dev.evictions() == 2);
  for (int s = 0; s < 3; ++s) CHECK(*dev.length(g[s]) == *cpu.length(c[s]));
  {  // a batch whose pages do not fit even with every other sequence on the host is refused
    std::vector<std::int64_t> many(40, 7);
    const step_input all[] = {{g[0], many}, {g[2], t}};
    CHECK(dev.step(all).error() ==
          "cuda backend: a batch of 2 sequences needs 5 more KV pages, and 0 are free with "
          "every other sequence on the host (kv_tokens)");
    for (int s : {0, 2}) CHECK(*dev.length(g[s]) == *cpu.length(c[s]));
  }
  CHECK(max_diff(decode(dev, g[1], t), decode(cpu, c[1], t)) < 1e-4);
}

TEST_CASE("emulated device: the DSpark draft contexts live on the device and move with their "
          "sequences") {
  auto backends = tiny_backends("cuda-backend-drafts", 9, 1);
  auto& cpu = backends.cpu;
  auto& dev = *backends.gpu;

  // Features of a prompt from the CPU backend, fed to both: the draft layers are compared.
  const std::vector<std::int64_t> prompt{3, 141, 59, 26, 5, 35, 89, 79, 32, 38};
  const sequence_id c = cpu.open_sequence(), c2 = cpu.open_sequence();
  const sequence_id g = dev.open_sequence(), g2 = dev.open_sequence();
  std::vector<float> f;
  const step_input ci{c, prompt};
  const std::int64_t last = 1;
  REQUIRE(cpu.step_tail(std::span(&ci, 1), std::span(&last, 1), &f));
  const std::size_t width = f.size() / prompt.size();
  auto rows = [&](std::size_t first, std::size_t n) {
    return std::span<const float>(f).subspan(first * width, n * width);
  };
  auto both = [&](sequence_id on_cpu, sequence_id on_dev, std::int64_t position,
                  std::span<const float> features, std::int64_t anchor) {
    const draft_request rc{on_cpu, position, features, anchor}, rg{on_dev, position, features,
                                                                   anchor};
    auto want = cpu.draft(std::span(&rc, 1));
    auto got = dev.draft(std::span(&rg, 1));
    REQUIRE_MESSAGE(want, want.error());
    REQUIRE_MESSAGE(got, got.error());
    CHECK(got->tokens == want->tokens);
    CHECK(max_diff(got->logits, want->logits) < 1e-4);
  };
  both(c, g, 0, rows(0, 8), 7);
  // g2's prompt takes the device's only place: g and its draft context wait on the host.
  const step_input gi{g2, prompt};
  REQUIRE(dev.step_tail(std::span(&gi, 1), std::span(&last, 1), nullptr));
  CHECK(dev.evictions() == 1);
  auto on_host = dev.export_draft(g);
  REQUIRE_MESSAGE(on_host, on_host.error());
  CHECK(*on_host == *cpu.export_draft(c));  // the tiny model's context rows are exact
  // Its next draft brings it back, the context with it (lost, the drafts would differ).
  both(c, g, 8, rows(8, 2), 11);
  CHECK(dev.evictions() == 2);
  // A context imported into a sequence on the host reaches the device with it.
  REQUIRE(cpu.import_draft(c2, *cpu.export_draft(c)));
  REQUIRE(dev.import_draft(g2, *dev.export_draft(g)));
  both(c2, g2, 10, rows(2, 1), 200);
  CHECK(dev.evictions() == 3);
  CHECK(dev.import_draft(g, "x").error() == cpu.import_draft(c, "x").error());
  REQUIRE(dev.close_sequence(g2));
  CHECK(dev.export_draft(g2).error() == "backend: no sequence 2");
}

// The CUDA engine's forward pass (kernels/cuda/device_model.cpp) on the emulated device
// (emulated_device.cpp): its kernels under the SIMT emulator, its GEMMs a plain loop, against
// the CPU engine on the golden models and the tiny preset, and sequences moved between them.
#include "simt.hpp"  // the emulator's thread order

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "kernels/cuda/device_memory.hpp"
#include "kernels/cuda/device_model.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/model.hpp"
#include "kernels/model_init.hpp"
#include "kernels/model_weights.hpp"
#include "tests/cuda_host/device_model_check.hpp"
#include "tests/cuda_host/emulated_device.hpp"
#include "tests/kernels/scratch.hpp"

using namespace troupe::kernels;
namespace simt = troupe::test::simt;

namespace {

const std::filesystem::path golden = std::filesystem::path(TROUPE_SOURCE_DIR) /
                                     "tests/kernels/golden/model";

}  // namespace

TEST_CASE("emulated device: the forward pass gives the CPU engine's logits and greedy tokens") {
  auto m = model::load(golden / "sliding");
  REQUIRE_MESSAGE(m, m.error());
  // Each order of a block's threads: a kernel that reads what another thread of its block
  // writes without a barrier between gets another result in one of them.
  for (auto order : {simt::order::ascending, simt::order::descending, simt::order::warp_by_warp}) {
    const std::string thread_order = order == simt::order::ascending    ? "ascending"
                                     : order == simt::order::descending ? "descending"
                                                                        : "warp by warp";
    CAPTURE(thread_order);
    simt::thread_order() = order;
    auto dev = cuda::device_model::upload(*m, {.max_sequences = 3});
    REQUIRE_MESSAGE(dev, dev.error());
    troupe::test::check_against_cpu("sliding", *m, *dev, 24);
  }
  simt::thread_order() = simt::order::ascending;
}

TEST_CASE("emulated device: the tiny preset (CSA2, Engram, fp8 window rows) against the CPU") {
  // Six layers (window, ratio 2 and 1, a candidate source), Engram on the second, head 32 (the
  // window rows go through the fp8 quantiser), weights written in the released FP8 / FP4 formats.
  const auto dir = testing::scratch_root() / "device-model-tiny";
  REQUIRE(write_random_model(dir, "tiny", 3));
  auto m = model::load(dir);
  REQUIRE_MESSAGE(m, m.error());
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 3});
  REQUIRE_MESSAGE(dev, dev.error());
  // Without the token map the Engram layers cannot hash: refused, as the CPU refuses.
  const std::vector<std::int64_t> t{1, 2};
  auto id = dev->open_sequence();
  REQUIRE(id);
  std::vector<step_input> call{{*id, t}};
  CHECK(dev->forward(call).error() ==
        "device_model: the Engram layers need the compressed token map "
        "(model::set_engram_token_map)");
  REQUIRE(dev->close_sequence(*id));
  REQUIRE(troupe::test::set_identity_engram_map(*m));
  troupe::test::check_against_cpu("tiny", *m, *dev, 24);
}

TEST_CASE("emulated device: sequences are checked, counted and freed") {
  auto m = model::load(golden / "sliding");
  REQUIRE(m);
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 2});
  REQUIRE(dev);
  auto a = dev->open_sequence();
  auto b = dev->open_sequence();
  REQUIRE(a);
  REQUIRE(b);
  auto full = dev->open_sequence();
  REQUIRE_FALSE(full);
  CHECK(full.error() == "device_model: all 2 sequences are open");
  const std::vector<std::int64_t> t{1, 2, 3};
  const std::vector<std::int64_t> bad{1, 64};
  std::vector<step_input> twice{{*a, t}, {*a, t}};
  CHECK(dev->forward(twice).error() == "device_model: sequence 1 twice in one batch");
  std::vector<step_input> out_of_range{{*b, bad}};
  CHECK(dev->forward(out_of_range).error() ==
        "device_model: sequence 2 token 1 is 64, expected 0 <= id < 64");
  std::vector<step_input> ok{{*a, t}};
  auto logits = dev->forward(ok);
  REQUIRE(logits);
  CHECK(logits->size() == 3 * 64);
  CHECK(*dev->length(*a) == 3);
  CHECK(*dev->length(*b) == 0);  // the refused call left it as it was
  REQUIRE(dev->close_sequence(*a));
  CHECK_FALSE(dev->length(*a));
  CHECK(dev->open_sequence());  // its slot is free again
}

TEST_CASE("emulated device: CSA2 layers (the compressor, indexer, candidate blocks) against the CPU") {
  // mixed: ratio-2 and ratio-1 KV sources, three index sources, a candidate source, Engram;
  // qat: a ratio-2 layer first; ratio4: ratio-4 groups, a top-2 indexer, no candidate source.
  for (const std::string name : {"mixed", "qat", "ratio4"}) {
    CAPTURE(name);
    auto m = model::load(golden / name);
    REQUIRE_MESSAGE(m, m.error());
    REQUIRE(troupe::test::set_identity_engram_map(*m));
    auto dev = cuda::device_model::upload(*m, {.max_sequences = 3});
    REQUIRE_MESSAGE(dev, dev.error());
    troupe::test::check_against_cpu(name, *m, *dev, 24);
  }
}

TEST_CASE("emulated device: compressed KV in pages of a few tokens, interleaved between "
          "sequences") {
  // Pages of 4 tokens (2 rows of a ratio-2 store, 1 of ratio 4, 4 of ratio 1): the prefill
  // takes pages in a run, then the two sequences' decode steps take them in turns, so each
  // sequence's groups lie in pages scattered over the stores.
  for (const std::string name : {"mixed", "ratio4"}) {
    CAPTURE(name);
    auto m = model::load(golden / name);
    REQUIRE_MESSAGE(m, m.error());
    REQUIRE(troupe::test::set_identity_engram_map(*m));
    auto dev = cuda::device_model::upload(*m, {.max_sequences = 3, .page_tokens = 4});
    REQUIRE_MESSAGE(dev, dev.error());
    troupe::test::check_against_cpu(name, *m, *dev, 24);
  }
}

TEST_CASE("emulated device: a call that needs more pages than are free is refused before "
          "anything runs") {
  auto m = model::load(golden / "qat");  // ratio 2
  REQUIRE(m);
  CHECK(cuda::device_model::upload(*m, {.page_tokens = 3}).error() ==
        "device_model: pages of 3 tokens do not hold whole groups of the compressor's ratio 2");
  CHECK(cuda::device_model::upload(*m, {.page_tokens = 0}).error() ==
        "device_model: pages of 0 tokens, a pool of 0 tokens: expected at least 1 and 0 "
        "(what the memory has room for)");
  // A pool of 4 pages of 4 tokens.
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 2, .page_tokens = 4, .kv_tokens = 14});
  REQUIRE(dev);
  CHECK(dev->free_pages() == 4);
  CHECK(dev->pages_for(0) == 0);
  CHECK(dev->pages_for(9) == 3);
  auto a = dev->open_sequence();
  auto b = dev->open_sequence();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(*dev->pages_to_grow(*a, 12) == 3);
  CHECK(dev->pages_to_grow(999, 1).error() == "device_model: no sequence 999");
  std::vector<std::int64_t> twelve(12), eight(8);
  for (std::size_t i = 0; i < twelve.size(); ++i) twelve[i] = static_cast<std::int64_t>(i * 5 + 1);
  for (std::size_t i = 0; i < eight.size(); ++i) eight[i] = static_cast<std::int64_t>(i * 7 + 2);
  const step_input first{*a, twelve};
  REQUIRE(dev->forward(std::span(&first, 1)));
  CHECK(dev->free_pages() == 1);
  CHECK(*dev->pages_to_grow(*a, 13) == 1);
  // b's 8 tokens need 2 pages; with a decode step of a beside them, 3.
  const std::vector<std::int64_t> one{3};
  const step_input both[] = {{*a, one}, {*b, eight}};
  CHECK(dev->forward(both).error() == "device_model: 3 more KV pages needed, 1 free (pages of 4 tokens)");
  CHECK(*dev->length(*a) == 12);  // nothing ran
  CHECK(*dev->length(*b) == 0);
  CHECK(dev->free_pages() == 1);
  // a's pages come back when it closes, and b runs on them as the CPU engine does.
  REQUIRE(dev->close_sequence(*a));
  CHECK(dev->free_pages() == 4);
  auto empty = dev->import_sequence(m->new_sequence());  // an empty cache takes no page
  REQUIRE(empty);
  CHECK(dev->free_pages() == 4);
  REQUIRE(dev->close_sequence(*empty));
  const step_input second{*b, eight};
  auto got = dev->forward(std::span(&second, 1));
  REQUIRE_MESSAGE(got, got.error());
  CHECK(dev->free_pages() == 2);
  auto cpu = m->new_sequence();
  const sequence_input in{&cpu, eight};
  auto want = m->forward(std::span(&in, 1));
  REQUIRE(want);
  REQUIRE(got->size() == want->size());
  double d = 0;
  for (std::size_t i = 0; i < want->size(); ++i) d = std::max(d, double(std::fabs((*got)[i] - (*want)[i])));
  CHECK(d < 1e-4);
  // A cache longer than the free pages hold is not imported.
  auto long_cache = m->new_sequence();
  const sequence_input twelve_in{&long_cache, twelve};
  REQUIRE(m->forward(std::span(&twelve_in, 1)));
  CHECK(dev->import_sequence(long_cache).error() ==
        "device_model: 3 more KV pages needed, 2 free (pages of 4 tokens)");
}

TEST_CASE("emulated device: without kv_tokens the page pool takes the memory the fraction "
          "leaves") {
  auto m = model::load(golden / "mixed");  // ratio-2 and ratio-1 KV sources, indexer keys
  REQUIRE(m);
  REQUIRE(troupe::test::set_identity_engram_map(*m));
  // Sequences of 24 tokens in pages of 4: 6 pages each, 18 for three.
  cuda::device_model_options o{.max_sequences = 3, .max_context = 24, .page_tokens = 4,
                               .memory_fraction = 0.5, .work_bytes = 1000};
  const std::int64_t before = troupe::test::emulated_memory_used();
  std::int64_t page = 0, weights = 0;
  {
    // Memory to spare: every sequence's pages, and no more.
    auto dev = cuda::device_model::upload(*m, o);
    REQUIRE_MESSAGE(dev, dev.error());
    CHECK(dev->pages() == 18);
    CHECK(dev->kv_tokens() == 72);
    page = dev->page_bytes();
    // Per page of 4 tokens: 4 / ratio fp32 rows of head_dim in each KV source's store and of
    // index_head_dim in each key owner's.
    const auto& W = m->tensors();
    std::int64_t floats = 0;
    for (const auto& L : W.layers) {
      const std::int64_t rows = 4 / std::max<std::int64_t>(1, L.ratio);
      if (L.kv_source) floats += rows * W.cfg.text.head_dim;
      if (L.owns_index_keys) floats += rows * W.cfg.text.index_head_dim;
    }
    CHECK(floats > 0);
    CHECK(page == 4 * floats);
    weights = troupe::test::emulated_memory_used() - before - 18 * page;  // weights and rings
    CHECK(weights > 0);
  }
  CHECK(troupe::test::emulated_memory_used() == before);  // all of it freed with the device
  // A total whose half leaves room for 10 pages and half of one after the model's weights and
  // rings and the call's work; what others hold (`before`) is not the model's.
  auto total_for = [&](std::int64_t pages) {
    return 2 * (weights + o.work_bytes + pages * page + page / 2);
  };
  troupe::test::set_emulated_memory(before + total_for(10));
  {
    auto dev = cuda::device_model::upload(*m, o);
    REQUIRE_MESSAGE(dev, dev.error());
    CHECK(dev->pages() == 10);
    CHECK(dev->free_pages() == 10);
    // One sequence at max_context fits; a second of 20 tokens beside it does not.
    auto a = dev->open_sequence();
    auto b = dev->open_sequence();
    REQUIRE((a && b));
    std::vector<std::int64_t> full(24), twenty(20);
    for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<std::int64_t>(i * 3 % 50 + 1);
    for (std::size_t i = 0; i < twenty.size(); ++i) twenty[i] = static_cast<std::int64_t>(i * 5 % 50 + 2);
    const step_input first{*a, full};
    REQUIRE(dev->forward(std::span(&first, 1)));
    const step_input second{*b, twenty};
    CHECK(dev->forward(std::span(&second, 1)).error() ==
          "device_model: 5 more KV pages needed, 4 free (pages of 4 tokens)");
  }
  {
    // Another model on the device holding 7 pages' worth does not count against this one's
    // share (the memory stays free enough for it) ...
    auto other = cuda::device_alloc(static_cast<std::size_t>(7 * page));
    REQUIRE(other);
    {
      auto dev = cuda::device_model::upload(*m, o);
      REQUIRE_MESSAGE(dev, dev.error());
      CHECK(dev->pages() == 10);
    }
    // ... but the pool takes free memory only: the whole device as the share, and a total that
    // leaves 8 pages and half of one free after the weights and the work.
    auto all = o;
    all.memory_fraction = 1;
    troupe::test::set_emulated_memory(troupe::test::emulated_memory_used() + weights +
                                      o.work_bytes + 8 * page + page / 2);
    auto squeezed = cuda::device_model::upload(*m, all);
    REQUIRE_MESSAGE(squeezed, squeezed.error());
    CHECK(squeezed->pages() == 8);
    cuda::device_free(*other);
  }
  // Room for 5 pages: not one sequence of 24 tokens.
  troupe::test::set_emulated_memory(before + total_for(5));
  auto small = cuda::device_model::upload(*m, o);
  REQUIRE_FALSE(small);
  CHECK(small.error().starts_with("device_model: no room for one sequence of 24 tokens: it takes "
                                  "6 KV pages of "));
  CHECK(small.error().find(" KiB, and 5 fit: of ") != std::string::npos);
  CHECK(small.error().ends_with("is kept for a call's work; lower the context or raise the "
                                "memory fraction"));
  // A pool asked for in tokens is allocated as asked, and fails as an allocation fails.
  o.kv_tokens = std::int64_t{1} << 40;
  auto huge = cuda::device_model::upload(*m, o);
  REQUIRE_FALSE(huge);
  CHECK(huge.error().starts_with("device_model: allocating 274877906944 KV pages: emulated "
                                 "device: out of memory"));
  troupe::test::set_emulated_memory(std::int64_t{1} << 32);
  CHECK(troupe::test::emulated_memory_used() == before);
  o.kv_tokens = 0;
  o.memory_fraction = 1.5;
  CHECK(cuda::device_model::upload(*m, o).error() ==
        "device_model: a memory fraction of 1.500000 and 1000 bytes for a call's work: expected "
        "a fraction in (0, 1] and bytes >= 0");
}

TEST_CASE("emulated device: a sequence longer than max_context is refused before anything runs") {
  auto m = model::load(golden / "qat");
  REQUIRE(m);
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 1, .max_context = 8});
  REQUIRE(dev);
  auto id = dev->open_sequence();
  REQUIRE(id);
  const std::vector<std::int64_t> t{1, 2, 3, 4, 5, 6};
  std::vector<step_input> call{{*id, t}};
  REQUIRE(dev->forward(call));
  CHECK(dev->forward(call).error() ==
        "device_model: sequence 1 would hold 12 tokens, more than max_context 8");
  CHECK(*dev->length(*id) == 6);
}

TEST_CASE("emulated device: a sequence moves between the device and the CPU in the KV formats") {
  // The tiny preset (CSA2 ratio 2 and 1, Engram): a 131-token prompt holds one full block and
  // leaves a ratio-2 group unfinished.
  const auto dir = testing::scratch_root() / "device-model-move";
  REQUIRE(write_random_model(dir, "tiny", 5));
  auto m = model::load(dir);
  REQUIRE(m);
  REQUIRE(troupe::test::set_identity_engram_map(*m));
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 4, .page_tokens = 6});
  REQUIRE(dev);
  {
    // Pages of 6 tokens (3 rows of the ratio-2 store, so a block's 64 rows cross pages), and
    // scattered: two sequences take them in turns, then one of them closes, so the sequences
    // below get every other page first.
    auto f1 = dev->open_sequence();
    auto f2 = dev->open_sequence();
    REQUIRE(f1);
    REQUIRE(f2);
    const std::vector<std::int64_t> six{1, 2, 3, 4, 5, 6};
    for (int i = 0; i < 8; ++i) {
      const step_input in[] = {{*f1, six}, {*f2, six}};
      REQUIRE(dev->forward(in));
    }
    REQUIRE(dev->close_sequence(*f1));
  }
  const std::int64_t V = m->text().vocab_size;
  std::vector<std::int64_t> prompt(131), next(5);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int64_t>((i * 37 + 11) % 256);
  for (std::size_t i = 0; i < next.size(); ++i) next[i] = static_cast<std::int64_t>((i * 91 + 3) % 256);
  // Each next token's logits from a CPU cache, one decode step at a time.
  auto cpu_continue = [&](sequence_cache& c) {
    std::vector<float> out;
    for (const auto t : next) {
      const std::vector<std::int64_t> one{t};
      const sequence_input in{&c, one};
      auto l = m->forward(std::span(&in, 1));
      REQUIRE(l);
      out.insert(out.end(), l->begin(), l->end());
    }
    return out;
  };
  auto dev_continue = [&](sequence_id id) {
    std::vector<float> out;
    for (const auto t : next) {
      const std::vector<std::int64_t> one{t};
      const step_input in{id, one};
      auto l = dev->forward(std::span(&in, 1));
      REQUIRE_MESSAGE(l, l.error());
      out.insert(out.end(), l->begin(), l->end());
    }
    return out;
  };
  auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0, big = 1;
    for (std::size_t i = 0; i < a.size(); ++i) {
      d = std::max(d, double(std::fabs(a[i] - b[i])));
      big = std::max(big, double(std::fabs(b[i])));
    }
    MESSAGE("max difference " << d);
    return d <= 1e-4 * big;
  };
  auto prefilled = m->new_sequence();
  {
    const sequence_input in{&prefilled, prompt};
    REQUIRE(m->forward(std::span(&in, 1)));
  }
  auto reference_cache = prefilled;
  const auto reference = cpu_continue(reference_cache);
  REQUIRE(reference.size() == next.size() * static_cast<std::size_t>(V));

  SUBCASE("device to CPU through the serialised Block, State and SWA KV") {
    auto id = dev->open_sequence();
    REQUIRE(id);
    const step_input in{*id, prompt};
    REQUIRE(dev->forward(std::span(&in, 1)));
    auto exported = dev->export_sequence(*id);
    REQUIRE_MESSAGE(exported, exported.error());
    CHECK(exported->length == 131);
    REQUIRE(full_blocks(*exported) == 1);
    CHECK(*dev->full_blocks(*id) == 1);  // counted on the device, nothing downloaded
    auto block = serialize_block(*exported, 0);
    auto state = serialize_state(*exported);
    auto swa = serialize_swa(*exported);
    REQUIRE(block);
    REQUIRE(state);
    REQUIRE(swa);
    auto restored = m->new_sequence();
    REQUIRE(restore_block(restored, 0, *block));
    REQUIRE(restore_state(restored, *state));
    REQUIRE(restore_swa(restored, *swa));
    CHECK(close(cpu_continue(restored), reference));
    // The block's rows read alone give the same bytes.
    CHECK(*dev->export_block(*id, 0) == *block);
  }
  SUBCASE("a block's rows read alone give serialize_block's bytes") {
    // A 300-token sequence (two full blocks and a partial one) made on the CPU and imported.
    std::vector<std::int64_t> longer(300);
    for (std::size_t i = 0; i < longer.size(); ++i)
      longer[i] = static_cast<std::int64_t>((i * 53 + 7) % 256);
    auto cache = m->new_sequence();
    const sequence_input in{&cache, longer};
    REQUIRE(m->forward(std::span(&in, 1)));
    REQUIRE(full_blocks(cache) == 2);
    auto id = dev->import_sequence(cache);
    REQUIRE_MESSAGE(id, id.error());
    for (std::int64_t b = 0; b < 2; ++b) {
      CAPTURE(b);
      auto got = dev->export_block(*id, b);
      REQUIRE_MESSAGE(got, got.error());
      CHECK(*got == *serialize_block(cache, b));
    }
    CHECK(dev->export_block(*id, 2).error() == serialize_block(cache, 2).error());
    CHECK(dev->export_block(999, 0).error() == "device_model: no sequence 999");
  }
  SUBCASE("CPU to device") {
    auto id = dev->import_sequence(prefilled);
    REQUIRE_MESSAGE(id, id.error());
    CHECK(*dev->length(*id) == 131);
    CHECK(close(dev_continue(*id), reference));
  }
  SUBCASE("a bounded replay on the CPU, continued on the device") {
    // Recomputing the last 3 tokens: the rings start at 128, so the next tokens' windows reach
    // back past what they hold.
    auto blocks = m->new_sequence();
    auto block = serialize_block(prefilled, 0);
    REQUIRE(block);
    REQUIRE(restore_block(blocks, 0, *block));
    REQUIRE(m->replay(blocks, prompt, 2));
    REQUIRE(blocks.layers[0].window.begin() == 128);
    auto on_cpu = blocks;
    const auto want = cpu_continue(on_cpu);
    auto id = dev->import_sequence(blocks);
    REQUIRE_MESSAGE(id, id.error());
    CHECK(close(dev_continue(*id), want));
  }
  SUBCASE("refusals") {
    auto other = model::load(golden / "sliding");
    REQUIRE(other);
    CHECK(dev->import_sequence(other->new_sequence()).error() ==
          "device_model: the cache was made by another model");
    CHECK_FALSE(dev->export_sequence(999));
  }
}

TEST_CASE("emulated device: batch-invariant mode gives a sequence the same bits in any batch") {
  // The emulated device's GEMM sums in an order that depends on the row count, as cuBLASLt's
  // does: without the mode the two runs differ; with it they must not.
  auto m = model::load(golden / "mixed");
  REQUIRE(m);
  REQUIRE(troupe::test::set_identity_engram_map(*m));
  for (const bool invariant : {false, true}) {
    CAPTURE(invariant);
    auto dev = cuda::device_model::upload(*m, {.max_sequences = 3, .batch_invariant = invariant});
    REQUIRE(dev);
    const auto runs = troupe::test::alone_and_batched(*m, *dev);
    if (invariant)
      CHECK(runs.batched == runs.alone);
    else
      CHECK(runs.batched != runs.alone);  // the emulated GEMM's order matters: the check has teeth
  }
}

TEST_CASE("emulated device: a rolled-back draft leaves the device as kernels::rollback leaves a "
          "CPU cache, and the DSpark features are the CPU engine's") {
  // The tiny preset (CSA2 ratio 2, DSpark targets) and the ratio4 golden (groups of 4: a
  // rollback reaches back into a completed group).
  const auto tiny = testing::scratch_root() / "device-rollback-tiny";
  REQUIRE(write_random_model(tiny, "tiny", 5));
  for (const auto& dir : {tiny, golden / "ratio4"}) troupe::test::check_rollbacks(dir);
}

TEST_CASE("emulated device: an expert placement runs its ranks one after another, with the same "
          "logits in batch-invariant mode, and the router's counts are the CPU engine's") {
  auto m = model::load(golden / "mixed", {.batch_invariant = true});
  REQUIRE(m);
  REQUIRE(troupe::test::set_identity_engram_map(*m));
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 2, .batch_invariant = true});
  REQUIRE_MESSAGE(dev, dev.error());
  const auto E = static_cast<std::int32_t>(m->text().n_routed_experts);
  std::vector<std::int64_t> prompt(23);
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<std::int64_t>((i * 29 + 5) % static_cast<std::size_t>(m->text().vocab_size));
  auto run = [&](std::span<const std::int64_t> tokens) {
    auto id = dev->open_sequence();
    REQUIRE(id);
    const step_input in{*id, tokens};
    auto l = dev->forward(std::span(&in, 1));
    REQUIRE_MESSAGE(l, l.error());
    REQUIRE(dev->close_sequence(*id));
    return std::move(*l);
  };
  const auto one_group = run(prompt);
  // The router's counts, as the CPU model counts the same tokens.
  auto cache = m->new_sequence();
  const sequence_input ci{&cache, prompt};
  REQUIRE(m->forward(std::span(&ci, 1)));
  CHECK(dev->expert_counts() == m->expert_counts());
  // Three ranks with two hot experts copied: the same bits.
  const std::int32_t hot[] = {0, 3};
  auto placed = place_experts(E, 3, hot);
  REQUIRE(placed);
  REQUIRE(dev->set_expert_placement(*placed));
  CHECK(run(prompt) == one_group);
  // A placement of another model is refused, and the last one stays.
  auto other = place_experts(E + 1, 2);
  REQUIRE(other);
  CHECK(dev->set_expert_placement(*other).error() ==
        "expert placement: it places " + std::to_string(E + 1) + " experts, the model has " +
            std::to_string(E) + " routed experts");
  REQUIRE(dev->set_expert_placement(std::nullopt));
  CHECK(run(prompt) == one_group);
}

TEST_CASE("emulated device: the DSpark draft layers give the CPU engine's drafts") {
  const auto dir = testing::scratch_root() / "device-model-drafts";
  REQUIRE(write_random_model(dir, "tiny", 7));
  troupe::test::check_drafts(dir);
}

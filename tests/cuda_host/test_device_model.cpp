// The CUDA engine's forward pass (kernels/cuda/device_model.cpp) on the emulated device
// (emulated_device.cpp): its kernels under the SIMT emulator, its GEMMs a plain loop, against
// the CPU engine on the golden sliding-window model.
#include "simt.hpp"  // the emulator's thread order

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <numeric>

#include "kernels/cuda/device_model.hpp"
#include "kernels/model.hpp"
#include "kernels/model_init.hpp"
#include "tests/cuda_host/device_model_check.hpp"
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
  // Both orders of a block's threads: a kernel that reads what another thread of its block
  // writes without a barrier between gets another result in one of them.
  for (auto order : {simt::order::ascending, simt::order::descending}) {
    const std::string thread_order = order == simt::order::ascending ? "ascending" : "descending";
    CAPTURE(thread_order);
    simt::thread_order() = order;
    auto dev = cuda::device_model::upload(*m, {.max_sequences = 3});
    REQUIRE_MESSAGE(dev, dev.error());
    const auto cmp = troupe::test::compare_with_cpu(*m, *dev, 24);
    REQUIRE_MESSAGE(cmp.error.empty(), cmp.error);
    MESSAGE("max |device - CPU| " << cmp.max_abs << " over " << cmp.rows
                                  << " rows (largest logit " << cmp.max_logit << ")");
    CHECK(cmp.calls == 6);
    CHECK(cmp.max_abs <= 1e-4 * std::max(1.0, cmp.max_logit));
    CHECK(cmp.argmax_differs == 0);
    CHECK(cmp.greedy_device.size() == 24);
    CHECK(cmp.greedy_device == cmp.greedy_cpu);
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
  std::vector<std::int64_t> identity(static_cast<std::size_t>(m->text().vocab_size));
  std::iota(identity.begin(), identity.end(), 0);
  REQUIRE(m->set_engram_token_map(identity));
  const auto cmp = troupe::test::compare_with_cpu(*m, *dev, 24);
  REQUIRE_MESSAGE(cmp.error.empty(), cmp.error);
  MESSAGE("tiny: max |device - CPU| " << cmp.max_abs << " over " << cmp.rows
                                      << " rows (largest logit " << cmp.max_logit << ")");
  CHECK(cmp.max_abs <= 1e-4 * std::max(1.0, cmp.max_logit));
  CHECK(cmp.argmax_differs == 0);
  CHECK(cmp.greedy_device.size() == 24);
  CHECK(cmp.greedy_device == cmp.greedy_cpu);
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
    if (!m->text().engram_layer_ids.empty()) {
      std::vector<std::int64_t> identity(static_cast<std::size_t>(m->text().vocab_size));
      std::iota(identity.begin(), identity.end(), 0);
      for (auto& id : identity) id %= m->text().engram_compressed_vocab_size;
      REQUIRE(m->set_engram_token_map(identity));
    }
    auto dev = cuda::device_model::upload(*m, {.max_sequences = 3});
    REQUIRE_MESSAGE(dev, dev.error());
    const auto cmp = troupe::test::compare_with_cpu(*m, *dev, 24);
    REQUIRE_MESSAGE(cmp.error.empty(), cmp.error);
    MESSAGE(name << ": max |device - CPU| " << cmp.max_abs << " over " << cmp.rows
                 << " rows (largest logit " << cmp.max_logit << ")");
    CHECK(cmp.max_abs <= 1e-4 * std::max(1.0, cmp.max_logit));
    CHECK(cmp.argmax_differs == 0);
    CHECK(cmp.greedy_device == cmp.greedy_cpu);
  }
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

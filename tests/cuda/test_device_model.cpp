// The CUDA engine's forward pass on a GPU (bench/gpu_check.sh) against the CPU engine: the
// check tests/cuda_host runs on the emulated device, here with the device's own math library,
// scheduling and cuBLASLt. The tolerance is the emulated device's bound; the device's expf /
// sinf / cosf (2 ulp) and cuBLASLt's summation order enter here, and the figures are printed
// for docs/benchmarks.md.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <numeric>
#include <unistd.h>

#include "kernels/cuda/device_model.hpp"
#include "kernels/model.hpp"
#include "kernels/model_init.hpp"
#include "tests/cuda_host/device_model_check.hpp"

using namespace troupe::kernels;

TEST_CASE("device: the forward pass (sliding golden) gives the CPU engine's logits and 64 greedy tokens") {
  const auto golden =
      std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model/sliding";
  auto m = model::load(golden);
  REQUIRE_MESSAGE(m, m.error());
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 3});
  REQUIRE_MESSAGE(dev, dev.error());
  const auto cmp = troupe::test::compare_with_cpu(*m, *dev, 64);
  REQUIRE_MESSAGE(cmp.error.empty(), cmp.error);
  MESSAGE("device_model on the sliding golden: max |device - CPU| " << cmp.max_abs << " over "
          << cmp.rows << " rows (largest logit " << cmp.max_logit << "), greedy "
          << cmp.greedy_device.size() << " steps");
  CHECK(cmp.calls == 6);
  CHECK(cmp.max_abs <= 1e-4 * std::max(1.0, cmp.max_logit));
  CHECK(cmp.argmax_differs == 0);
  CHECK(cmp.greedy_device.size() == 64);
  CHECK(cmp.greedy_device == cmp.greedy_cpu);
}

TEST_CASE("device: the tiny preset (CSA2, Engram, fp8 window rows) against the CPU engine") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("troupe-test-cuda-tiny-" + std::to_string(::getpid()));
  REQUIRE(write_random_model(dir, "tiny", 3));
  auto m = model::load(dir);
  REQUIRE_MESSAGE(m, m.error());
  std::vector<std::int64_t> identity(static_cast<std::size_t>(m->text().vocab_size));
  std::iota(identity.begin(), identity.end(), 0);
  REQUIRE(m->set_engram_token_map(identity));
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 3});
  REQUIRE_MESSAGE(dev, dev.error());
  const auto cmp = troupe::test::compare_with_cpu(*m, *dev, 64);
  std::filesystem::remove_all(dir);
  REQUIRE_MESSAGE(cmp.error.empty(), cmp.error);
  MESSAGE("device_model on tiny: max |device - CPU| " << cmp.max_abs << " over "
          << cmp.rows << " rows (largest logit " << cmp.max_logit << "), greedy "
          << cmp.greedy_device.size() << " steps");
  CHECK(cmp.max_abs <= 1e-4 * std::max(1.0, cmp.max_logit));
  CHECK(cmp.argmax_differs == 0);
  CHECK(cmp.greedy_device == cmp.greedy_cpu);
}

TEST_CASE("device: CSA2 layers (the golden mixed, qat and ratio4 models) against the CPU engine") {
  for (const std::string name : {"mixed", "qat", "ratio4"}) {
    CAPTURE(name);
    auto m = model::load(std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model" /
                         name);
    REQUIRE_MESSAGE(m, m.error());
    if (!m->text().engram_layer_ids.empty()) {
      std::vector<std::int64_t> map(static_cast<std::size_t>(m->text().vocab_size));
      std::iota(map.begin(), map.end(), 0);
      for (auto& id : map) id %= m->text().engram_compressed_vocab_size;
      REQUIRE(m->set_engram_token_map(map));
    }
    auto dev = cuda::device_model::upload(*m, {.max_sequences = 3});
    REQUIRE_MESSAGE(dev, dev.error());
    const auto cmp = troupe::test::compare_with_cpu(*m, *dev, 64);
    REQUIRE_MESSAGE(cmp.error.empty(), cmp.error);
    MESSAGE("device_model on " << name << ": max |device - CPU| " << cmp.max_abs << " over "
            << cmp.rows << " rows (largest logit " << cmp.max_logit << "), greedy "
            << cmp.greedy_device.size() << " steps");
    CHECK(cmp.max_abs <= 1e-4 * std::max(1.0, cmp.max_logit));
    CHECK(cmp.argmax_differs == 0);
    CHECK(cmp.greedy_device == cmp.greedy_cpu);
  }
}

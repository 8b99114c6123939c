// The CUDA engine's forward pass on a GPU (bench/gpu_check.sh) against the CPU engine: the
// check tests/cuda_host runs on the emulated device, here with the device's own math library,
// scheduling and cuBLASLt. The tolerance is the emulated device's bound; the device's expf /
// sinf / cosf (2 ulp) and cuBLASLt's summation order enter here, and the figures are printed
// for docs/benchmarks.md.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "kernels/cuda/device_model.hpp"
#include "kernels/model.hpp"
#include "kernels/model_init.hpp"
#include "tests/cuda_host/device_model_check.hpp"

using namespace troupe::kernels;

namespace {

void check(const std::filesystem::path& dir, const std::string& what) {
  auto m = model::load(dir);
  REQUIRE_MESSAGE(m, m.error());
  REQUIRE(troupe::test::set_identity_engram_map(*m));
  // Pages of 4 tokens: the sequences' compressed KV lies in pages they took in turns.
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 3, .page_tokens = 4});
  REQUIRE_MESSAGE(dev, dev.error());
  troupe::test::check_against_cpu("device_model on " + what, *m, *dev, 64);
}

}  // namespace

TEST_CASE("device: the forward pass of the golden models against the CPU engine") {
  // sliding: window layers only; mixed, qat, ratio4: CSA2 (ratio 2, 1, 4; a candidate source
  // in mixed) and Engram (mixed, ratio4).
  for (const std::string name : {"sliding", "mixed", "qat", "ratio4"}) {
    CAPTURE(name);
    check(std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model" / name,
          "the " + name + " golden");
  }
}

TEST_CASE("device: the tiny preset (CSA2, Engram, fp8 window rows) against the CPU engine") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("troupe-test-cuda-tiny-" + std::to_string(::getpid()));
  REQUIRE(write_random_model(dir, "tiny", 3));
  check(dir, "tiny");
  std::filesystem::remove_all(dir);
}

TEST_CASE("device: batch-invariant mode gives a sequence the same bits in any batch") {
  auto m = model::load(std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model/mixed");
  REQUIRE(m);
  REQUIRE(troupe::test::set_identity_engram_map(*m));
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 3, .batch_invariant = true});
  REQUIRE_MESSAGE(dev, dev.error());
  const auto runs = troupe::test::alone_and_batched(*m, *dev);
  CHECK(runs.batched == runs.alone);
}

TEST_CASE("device: a rolled-back draft leaves the device as kernels::rollback leaves a CPU cache") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("troupe-test-cuda-rollback-" + std::to_string(::getpid()));
  REQUIRE(write_random_model(dir, "tiny", 5));
  const auto ratio4 = std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model/ratio4";
  for (const auto& d : {dir, ratio4}) troupe::test::check_rollbacks(d);
  std::filesystem::remove_all(dir);
}

TEST_CASE("device: the DSpark draft layers give the CPU engine's drafts") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("troupe-test-cuda-drafts-" + std::to_string(::getpid()));
  REQUIRE(write_random_model(dir, "tiny", 7));
  troupe::test::check_drafts(dir);
  std::filesystem::remove_all(dir);
}

TEST_CASE("device: the page pool sized from the GPU's memory") {
  // On a GPU with memory to spare, every sequence at max_context; with a fraction below what
  // the weights take, refused with the figures (cudaMemGetInfo's, as the emulated device's).
  auto m = model::load(std::filesystem::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model/mixed");
  REQUIRE_MESSAGE(m, m.error());
  REQUIRE(troupe::test::set_identity_engram_map(*m));
  auto dev = cuda::device_model::upload(*m, {.max_sequences = 3, .max_context = 1024});
  REQUIRE_MESSAGE(dev, dev.error());
  CHECK(dev->pages() == 3 * 1024 / 256);
  CHECK(dev->page_bytes() > 0);
  auto none = cuda::device_model::upload(
    *m, {.max_sequences = 3, .max_context = 1024, .memory_fraction = 1e-6});
  REQUIRE_FALSE(none);
  CHECK(none.error().starts_with("device_model: no room for one sequence of 1024 tokens"));
}

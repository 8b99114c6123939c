// The serving graph of `troupe serve` (cluster/real_graph.hpp, without HTTP) with every device on
// cuda_backend, on the emulated device: a request's greedy tokens through the prefill → decode
// KV hand-off between two CUDA devices, requests decoding together, and speculative decoding
// (verify steps, rollbacks on the device, the DSpark drafts on the device) — each equal to troupe
// generate's on the CPU.
#include "kernels/cuda/cuda_backend.hpp"
#include "tests/cluster/real_graph_fixture.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

// Batch-invariant, as troupe serve's CUDA devices are.
kernels::backend_opener emulated_cuda() {
  kernels::cuda::cuda_backend_options o;
  o.batch_invariant = true;
  o.max_sequences = 8;
  return kernels::cuda::cuda_backend::opener(o);
}

} // namespace

TEST_CASE("emulated device: a request served on CUDA devices gets troupe generate's greedy "
          "tokens, through the KV hand-off between them") {
  fixture f{false, {}, 1, {}, {}, true, {}, 1, true, emulated_cuda()};
  check_handoff(f);
}

TEST_CASE("emulated device: requests decoding together on CUDA devices get their tokens alone, "
          "with and without speculative decoding") {
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::uint32_t id = 1; id <= 5; ++id)
    prompts.push_back(prompt_of(20 + 13 * id, id, 256));
  std::vector<std::vector<std::int32_t>> alone;
  for (const auto& p : prompts)
    alone.push_back(generate_greedy(p, 10));
  for (const std::string mode : {"off", "fixed3"}) {
    CAPTURE(mode);
    fixture f{false, {}, 1, *actors::parse_speculation(mode), {}, true, {}, 1, true,
              emulated_cuda()};
    caf::scoped_actor self{f.w.system()};
    std::vector<actors::generation_request> all;
    for (std::uint64_t id = 1; id <= prompts.size(); ++id)
      all.push_back(f.request(id, prompts[id - 1], 10, {}));
    auto out = f.run(self, std::move(all));
    REQUIRE(out.size() == prompts.size());
    for (std::uint64_t id = 1; id <= prompts.size(); ++id) {
      CAPTURE(id);
      CHECK(out[id].tokens == alone[id - 1]);
    }
  }
}

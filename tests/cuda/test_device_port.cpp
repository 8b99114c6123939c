// The device port running cuda_backend on the GPU, as `troupe serve` runs a device = "cuda" rank
// (tests/cuda_host/device_port_check.hpp; the same checks run on the emulated device).
#include "tests/cuda_host/device_port_check.hpp"

using troupe::test::device_fixture;

TEST_CASE_FIXTURE(device_fixture, "device port: cuda_backend decodes a CPU device's greedy tokens") {
  troupe::test::check_greedy_as_cpu(*this);
}

TEST_CASE_FIXTURE(device_fixture, "device port: KV moves from a CPU device to a CUDA device and "
                                  "back") {
  troupe::test::check_kv_both_ways(*this);
}

TEST_CASE_FIXTURE(device_fixture, "device port: what a CUDA device refuses") {
  troupe::test::check_refusals(*this);
}

TEST_CASE_FIXTURE(device_fixture, "device port: speculative decoding: verified drafts keep the CPU device's greedy tokens") {
  troupe::test::check_speculation(*this);
}

TEST_CASE_FIXTURE(device_fixture, "device port: expert-parallel load balancing: the router's counts and a placement applied") {
  troupe::test::check_expert_link(*this);
}

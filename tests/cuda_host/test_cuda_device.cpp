// The device port running cuda_backend on the emulated device (device_port_check.hpp).
#include "tests/cuda_host/device_port_check.hpp"

using troupe::test::device_fixture;

TEST_CASE_FIXTURE(device_fixture, "emulated device: a device port on cuda_backend decodes the CPU "
                                  "device's greedy tokens") {
  troupe::test::check_greedy_as_cpu(*this);
}

TEST_CASE_FIXTURE(device_fixture, "emulated device: KV moves from a CPU device to a CUDA device "
                                  "and back by kv_export / kv_import") {
  troupe::test::check_kv_both_ways(*this);
}

TEST_CASE_FIXTURE(device_fixture, "emulated device: what a device port on cuda_backend refuses") {
  troupe::test::check_refusals(*this);
}

TEST_CASE_FIXTURE(device_fixture, "emulated device: speculative decoding on a CUDA device: verified drafts keep the CPU device's greedy tokens") {
  troupe::test::check_speculation(*this);
}

TEST_CASE_FIXTURE(device_fixture, "emulated device: expert-parallel load balancing on a CUDA device: the router's counts and a placement applied") {
  troupe::test::check_expert_link(*this);
}

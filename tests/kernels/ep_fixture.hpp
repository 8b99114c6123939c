// Test helpers for expert-parallel groups (kernels/ep_exchange.hpp): an exchange that fails one
// rank's call, as a rank whose device dies in the middle of a step.
#pragma once

#include <memory>
#include <string>

#include "kernels/ep_exchange.hpp"

namespace troupe::kernels::testing {

// An exchange that fails rank `rank`'s `nth` call (counting from 1): a rank whose device died
// in the middle of a step. Every other call goes to the group's exchange.
class failing_exchange final : public ep_exchange {
 public:
  failing_exchange(std::int32_t ranks, std::int32_t rank, int nth)
      : inner_(local_exchange(ranks)), rank_(rank), nth_(nth) {}
  std::int32_t ranks() const override { return inner_->ranks(); }
  result<bool> all_gather(std::int32_t rank, std::span<float> buffer,
                          std::span<const std::int64_t> offsets) override {
    if (rank == rank_ && ++calls_ == nth_) {
      inner_->abort("rank " + std::to_string(rank) + "'s device failed");
      return result<bool>::failure("rank " + std::to_string(rank) + "'s device failed");
    }
    return inner_->all_gather(rank, buffer, offsets);
  }
  void abort(const std::string& why) override { inner_->abort(why); }
  void reset() override { inner_->reset(); }

 private:
  std::shared_ptr<ep_exchange> inner_;
  std::int32_t rank_;
  int nth_;
  int calls_ = 0;
};

}  // namespace troupe::kernels::testing

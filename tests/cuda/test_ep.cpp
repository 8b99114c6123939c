// Expert parallelism on one device: the NCCL communicator formed through the EP group's
// unique-id exchange, and the MoE layer at EP 2 (two ranks' buffers on one GPU, exchanged by
// device copies, since NCCL refuses two ranks on one GPU) equal to EP 1 (through NCCL).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "device_buffer.hpp"
#include "tests/cuda_host/kernel_test_support.hpp"
#include "kernels/backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/nccl_comm.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/ep_dispatch.hpp"
#include "kernels/ep_group.hpp"
#include "kernels/model.hpp"

using namespace troupe::kernels;
using troupe::test::device_buffer;
using troupe::test::random_values;

namespace {

constexpr std::int32_t E = 16, K = 4, T = 96;
constexpr std::int64_t W = 256;

// A one-GPU communicator made the way a real formation makes it: the root draws the id, the
// message is encoded and decoded, the member accepts it and joins.
cuda::ep_communicator one_rank_communicator() {
  const std::vector<gpu_id> gpus{0};
  auto plan = form_ep_group(1, 1, gpus, E);
  REQUIRE(plan.ok());
  auto id = cuda::new_unique_id();
  REQUIRE_MESSAGE(id.ok(), id.error());
  auto msg = decode_nccl_id_message(encode(unique_id_message(*plan, *id)));
  REQUIRE(msg.ok());
  auto args = accept_unique_id(*plan, 0, *msg);
  REQUIRE(args.ok());
  auto comm = cuda::ep_communicator::join(*args, 0);
  REQUIRE_MESSAGE(comm.ok(), comm.error());
  return std::move(*comm);
}

// Moves segments between ranks: exchange(src, dst, from, rows, to) copies `rows` rows.
using exchange_fn = std::function<void(std::int32_t, std::int32_t, const float*, std::int64_t, float*)>;

// The MoE layer over `ranks` EP ranks: tokens split evenly over the ranks, dispatched, each
// local expert a BF16 GEMM y = x · W_eᵀ over its rows (grouped by plan_receive), returned and
// combined. Returns the combined rows in token order.
std::vector<float> moe_layer(std::int32_t ranks, const std::vector<float>& x,
                             const std::vector<std::int32_t>& ids, const std::vector<float>& w,
                             const std::vector<std::uint16_t>& experts_bf16,
                             const exchange_fn& exchange) {
  auto p = place_experts(E, ranks);
  REQUIRE(p.ok());
  auto gemm = cuda::lt_gemm::create();
  REQUIRE(gemm.ok());
  const std::int32_t per = T / ranks;
  std::vector<dispatch_plan> plans;
  std::vector<std::unique_ptr<device_buffer<float>>> send, back;
  for (std::int32_t r = 0; r < ranks; ++r) {
    std::vector<std::int32_t> mine(ids.begin() + r * per * K, ids.begin() + (r + 1) * per * K);
    auto plan = plan_dispatch(*p, mine, K);
    REQUIRE(plan.ok());
    std::vector<float> xr(x.begin() + r * per * W, x.begin() + (r + 1) * per * W);
    device_buffer<float> dx(xr);
    device_buffer<std::int32_t> dsend(plan->send_copy);
    send.push_back(std::make_unique<device_buffer<float>>(plan->send_copy.size() * W));
    back.push_back(std::make_unique<device_buffer<float>>(plan->send_copy.size() * W));
    REQUIRE(cuda::moe_gather_rows(dx.get(), dsend.get(), static_cast<std::int64_t>(plan->send_copy.size()), K, W,
                                  send.back()->get()).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    plans.push_back(std::move(*plan));
  }
  for (std::int32_t dst = 0; dst < ranks; ++dst) {
    std::vector<std::vector<std::int32_t>> counts;
    std::int64_t total = 0;
    for (const auto& pl : plans) {
      counts.push_back(pl.expert_counts[static_cast<std::size_t>(dst)]);
      total += pl.send_counts[static_cast<std::size_t>(dst)];
    }
    device_buffer<float> recv(static_cast<std::size_t>(total * W));
    std::int64_t at = 0;
    for (std::int32_t src = 0; src < ranks; ++src) {
      const auto& pl = plans[static_cast<std::size_t>(src)];
      exchange(src, dst, send[static_cast<std::size_t>(src)]->get() + pl.send_offsets[static_cast<std::size_t>(dst)] * W,
               pl.send_counts[static_cast<std::size_t>(dst)], recv.get() + at * W);
      at += pl.send_counts[static_cast<std::size_t>(dst)];
    }
    auto rp = plan_receive(counts);
    REQUIRE(rp.ok());
    // Group by slot (host side here; a device permutation in the engine), run each expert.
    const auto rows = recv.download();
    std::vector<std::uint16_t> grouped(rows.size());
    for (std::size_t i = 0; i < rp->order.size(); ++i)
      for (std::int64_t d = 0; d < W; ++d)
        grouped[i * W + static_cast<std::size_t>(d)] = cuda::to_bf16(rows[static_cast<std::size_t>(rp->order[i] * W + d)]);
    device_buffer<std::uint16_t> dgrouped(grouped), dexperts(experts_bf16);
    device_buffer<float> out(rows.size());
    for (std::size_t slot = 0; slot + 1 < rp->slot_offsets.size(); ++slot) {
      const std::int64_t m = rp->slot_offsets[slot + 1] - rp->slot_offsets[slot];
      if (m == 0) continue;
      const std::int32_t e = p->local[static_cast<std::size_t>(dst)][slot];
      auto ran = gemm->run(dgrouped.get() + rp->slot_offsets[slot] * W, dexperts.get() + e * W * W,
                           out.get() + rp->slot_offsets[slot] * W, m, W, W);
      REQUIRE_MESSAGE(ran.ok(), ran.error());
    }
    const auto y = out.download();
    std::vector<float> ungrouped(y.size());
    for (std::size_t i = 0; i < rp->order.size(); ++i)
      std::copy_n(y.data() + i * W, W, ungrouped.data() + rp->order[i] * W);
    device_buffer<float> dun(ungrouped);
    at = 0;
    for (std::int32_t src = 0; src < ranks; ++src) {
      const auto& pl = plans[static_cast<std::size_t>(src)];
      exchange(dst, src, dun.get() + at * W, pl.send_counts[static_cast<std::size_t>(dst)],
               back[static_cast<std::size_t>(src)]->get() + pl.send_offsets[static_cast<std::size_t>(dst)] * W);
      at += pl.send_counts[static_cast<std::size_t>(dst)];
    }
  }
  std::vector<float> result;
  for (std::int32_t r = 0; r < ranks; ++r) {
    const auto& pl = plans[static_cast<std::size_t>(r)];
    std::vector<float> wr(w.begin() + r * per * K, w.begin() + (r + 1) * per * K);
    device_buffer<float> dw(wr), dy(static_cast<std::size_t>(per * W));
    device_buffer<std::int32_t> drow(pl.copy_row);
    REQUIRE(cuda::moe_combine_rows(back[static_cast<std::size_t>(r)]->get(), drow.get(), dw.get(), per, K, W, dy.get()).ok());
    const auto y = dy.download();
    result.insert(result.end(), y.begin(), y.end());
  }
  return result;
}

void copy_exchange(std::int32_t, std::int32_t, const float* from, std::int64_t rows, float* to) {
  if (rows > 0)
    REQUIRE(cudaMemcpy(to, from, sizeof(float) * static_cast<std::size_t>(rows * W),
                       cudaMemcpyDeviceToDevice) == cudaSuccess);
}

}  // namespace

TEST_CASE("a one-rank NCCL communicator formed through the unique-id message moves segments to itself") {
  auto comm = one_rank_communicator();
  CHECK(comm.size() == 1);
  CHECK(comm.rank() == 0);
  const auto x = random_values(static_cast<std::size_t>(10 * W), 3);
  device_buffer<float> send(x), recv(x.size());
  const std::vector<std::int32_t> counts{10}, offsets{0};
  auto moved = comm.all_to_all(send.get(), counts, offsets, recv.get(), counts, offsets, W, nullptr);
  REQUIRE_MESSAGE(moved.ok(), moved.error());
  CHECK(recv.download() == x);
}

TEST_CASE("the MoE layer at EP 2 on one GPU equals EP 1 through NCCL bit for bit") {
  std::vector<std::int32_t> ids;
  for (std::int32_t t = 0; t < T; ++t)
    for (std::int32_t j = 0; j < K; ++j) ids.push_back((t * 5 + j * 3 + t / 7) % E);
  auto x = random_values(static_cast<std::size_t>(T * W), 31);
  const auto w = random_values(static_cast<std::size_t>(T * K), 32, 0, 1);
  const auto experts = random_values(static_cast<std::size_t>(E * W * W), 33, -0.06f, 0.06f);
  std::vector<std::uint16_t> experts_bf16(experts.size());
  for (std::size_t i = 0; i < experts.size(); ++i) experts_bf16[i] = cuda::to_bf16(experts[i]);

  auto comm = one_rank_communicator();
  const exchange_fn through_nccl = [&](std::int32_t, std::int32_t, const float* from,
                                       std::int64_t rows, float* to) {
    const std::vector<std::int32_t> counts{static_cast<std::int32_t>(rows)}, offsets{0};
    auto moved = comm.all_to_all(from, counts, offsets, to, counts, offsets, W, nullptr);
    REQUIRE_MESSAGE(moved.ok(), moved.error());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  };
  const auto ep1 = moe_layer(1, x, ids, w, experts_bf16, through_nccl);
  const auto ep2 = moe_layer(2, x, ids, w, experts_bf16, copy_exchange);
  REQUIRE(ep1.size() == ep2.size());
  // Each expert gets the same rows in the same order at EP 1 and EP 2 (source 0's tokens, then
  // source 1's, copy order inside), so every GEMM has the same shape and operands.
  CHECK(std::memcmp(ep1.data(), ep2.data(), ep1.size() * 4) == 0);
}

TEST_CASE("two ranks of one NCCL communicator on the same GPU: refused by NCCL, or equal to EP 1") {
  const std::vector<int> devices{0, 0};
  auto comms = cuda::ep_communicator::join_all(devices);
  if (!comms) {
    MESSAGE("NCCL refuses two ranks on one GPU, as documented: " << comms.error());
    return;
  }
  MESSAGE("this NCCL accepted two ranks on one GPU");
  CHECK((*comms)[0].rank() == 0);
  CHECK((*comms)[1].rank() == 1);
}

TEST_CASE("cuda_backend opens a model and steps as cpu_backend does") {
  const std::string dir = std::string(TROUPE_SOURCE_DIR) + "/tests/kernels/golden/model/sliding";
  auto gpu = cuda::cuda_backend::open(dir);
  REQUIRE_MESSAGE(gpu, gpu.error());
  auto m = model::load(dir);
  REQUIRE(m);
  cpu_backend cpu(std::move(*m));
  const std::vector<std::int64_t> prompt{3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6, 26};
  const step_input gi{(*gpu)->open_sequence(), prompt}, ci{cpu.open_sequence(), prompt};
  auto got = (*gpu)->step(std::span(&gi, 1));
  auto want = cpu.step(std::span(&ci, 1));
  REQUIRE_MESSAGE(got, got.error());
  REQUIRE(want);
  REQUIRE(got->size() == want->size());
  float d = 0;
  for (std::size_t i = 0; i < got->size(); ++i) d = std::max(d, std::fabs((*got)[i] - (*want)[i]));
  MESSAGE("cuda_backend vs cpu_backend on the sliding golden: max difference " << d);
  CHECK(d < 4e-4);
}

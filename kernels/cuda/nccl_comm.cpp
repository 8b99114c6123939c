// The EP group's NCCL communicator (kernels/cuda/nccl_comm.hpp).
#include "kernels/cuda/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

namespace troupe::kernels::cuda {

static_assert(NCCL_UNIQUE_ID_BYTES == nccl_unique_id_bytes,
              "kernels/ep_group.hpp's nccl_unique_id_bytes must match nccl.h");

struct ep_communicator::state {
  ncclComm_t comm = nullptr;
  bool abort = false;
  ~state() {
    if (comm == nullptr) return;
    if (abort)
      ncclCommAbort(comm);
    else
      ncclCommDestroy(comm);
  }
};

namespace {
std::string nccl(const char* what, ncclResult_t r) {
  return std::string(what) + ": " + ncclGetErrorString(r);
}
}  // namespace

result<std::array<std::uint8_t, nccl_unique_id_bytes>> new_unique_id() {
  using r = result<std::array<std::uint8_t, nccl_unique_id_bytes>>;
  ncclUniqueId id;
  if (auto e = ncclGetUniqueId(&id); e != ncclSuccess) return r::failure(nccl("ncclGetUniqueId", e));
  std::array<std::uint8_t, nccl_unique_id_bytes> out{};
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

ep_communicator::ep_communicator(std::unique_ptr<state> s) : s_(std::move(s)) {}
ep_communicator::ep_communicator(ep_communicator&&) noexcept = default;
ep_communicator& ep_communicator::operator=(ep_communicator&&) noexcept = default;
ep_communicator::~ep_communicator() = default;

result<ep_communicator> ep_communicator::join(const comm_init_args& args, int device) {
  using r = result<ep_communicator>;
  if (auto e = cudaSetDevice(device); e != cudaSuccess)
    return r::failure(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  ncclUniqueId id;
  std::memcpy(id.internal, args.id.data(), args.id.size());
  auto s = std::make_unique<state>();
  if (auto e = ncclCommInitRank(&s->comm, args.nranks, id, args.rank); e != ncclSuccess) {
    s->comm = nullptr;
    return r::failure(nccl("ncclCommInitRank", e));
  }
  return ep_communicator(std::move(s));
}

result<std::vector<ep_communicator>> ep_communicator::join_all(std::span<const int> devices) {
  using r = result<std::vector<ep_communicator>>;
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  if (auto e = ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data());
      e != ncclSuccess)
    return r::failure(nccl("ncclCommInitAll", e));
  std::vector<ep_communicator> out;
  for (auto c : comms) {
    auto s = std::make_unique<state>();
    s->comm = c;
    out.push_back(ep_communicator(std::move(s)));
  }
  return out;
}

std::int32_t ep_communicator::rank() const {
  int r = -1;
  ncclCommUserRank(s_->comm, &r);
  return r;
}

std::int32_t ep_communicator::size() const {
  int n = 0;
  ncclCommCount(s_->comm, &n);
  return n;
}

void ep_communicator::abort_on_close() { s_->abort = true; }

result<bool> ep_communicator::all_to_all(const float* send, std::span<const std::int32_t> send_counts,
                                         std::span<const std::int32_t> send_offsets, float* recv,
                                         std::span<const std::int32_t> recv_counts,
                                         std::span<const std::int32_t> recv_offsets,
                                         std::int64_t width, void* stream) {
  using r = result<bool>;
  const auto n = static_cast<std::size_t>(size());
  if (send_counts.size() != n || send_offsets.size() != n || recv_counts.size() != n ||
      recv_offsets.size() != n)
    return r::failure("all_to_all: counts and offsets must list " + std::to_string(n) + " ranks");
  auto st = static_cast<cudaStream_t>(stream);
  if (auto e = ncclGroupStart(); e != ncclSuccess) return r::failure(nccl("ncclGroupStart", e));
  ncclResult_t failed = ncclSuccess;
  for (std::size_t peer = 0; peer < n && failed == ncclSuccess; ++peer) {
    const int p = static_cast<int>(peer);
    if (send_counts[peer] > 0)
      failed = ncclSend(send + static_cast<std::int64_t>(send_offsets[peer]) * width,
                        static_cast<std::size_t>(send_counts[peer] * width), ncclFloat32, p,
                        s_->comm, st);
    if (failed == ncclSuccess && recv_counts[peer] > 0)
      failed = ncclRecv(recv + static_cast<std::int64_t>(recv_offsets[peer]) * width,
                        static_cast<std::size_t>(recv_counts[peer] * width), ncclFloat32, p,
                        s_->comm, st);
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (failed != ncclSuccess) return r::failure(nccl("ncclSend/ncclRecv", failed));
  if (ended != ncclSuccess) return r::failure(nccl("ncclGroupEnd", ended));
  return true;
}

}  // namespace troupe::kernels::cuda

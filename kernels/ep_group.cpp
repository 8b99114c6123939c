// EP group bookkeeping (kernels/ep_group.hpp).
#include "kernels/ep_group.hpp"

#include <algorithm>
#include <cstring>
#include <set>

namespace troupe::kernels {

namespace {

constexpr char tag[4] = {'T', 'E', 'P', 'G'};
constexpr std::size_t message_bytes = 4 + 8 + 8 + 4 + 4 + nccl_unique_id_bytes;

void put(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get(std::string_view in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)]))
         << (8 * i);
  return v;
}

std::set<std::int32_t> held(const ep_group_plan& p, gpu_id gpu) {
  const auto r = p.rank_of(gpu);
  if (r < 0) return {};
  const auto& l = p.placement.local[static_cast<std::size_t>(r)];
  return {l.begin(), l.end()};
}

}  // namespace

std::int32_t ep_group_plan::rank_of(gpu_id gpu) const {
  auto it = std::lower_bound(members.begin(), members.end(), gpu);
  return it != members.end() && *it == gpu ? static_cast<std::int32_t>(it - members.begin()) : -1;
}

result<ep_group_plan> form_ep_group(std::uint64_t instance, std::uint64_t generation,
                                    std::span<const gpu_id> healthy, std::int32_t experts,
                                    std::span<const std::int32_t> replicated) {
  using r = result<ep_group_plan>;
  if (healthy.empty()) return r::failure("form_ep_group: no healthy GPU");
  ep_group_plan p;
  p.instance = instance;
  p.generation = generation;
  p.members.assign(healthy.begin(), healthy.end());
  std::sort(p.members.begin(), p.members.end());
  if (auto d = std::adjacent_find(p.members.begin(), p.members.end()); d != p.members.end())
    return r::failure("form_ep_group: GPU " + std::to_string(*d) + " listed twice");
  auto placement = place_experts(experts, p.size(), replicated);
  if (!placement) return r::failure("form_ep_group: " + placement.error());
  p.placement = std::move(*placement);
  return p;
}

nccl_id_message unique_id_message(const ep_group_plan& plan,
                                  const std::array<std::uint8_t, nccl_unique_id_bytes>& id) {
  nccl_id_message m;
  m.instance = plan.instance;
  m.generation = plan.generation;
  m.size = plan.size();
  m.root = plan.root();
  m.id = id;
  return m;
}

std::string encode(const nccl_id_message& m) {
  std::string out(tag, 4);
  put(out, m.instance, 8);
  put(out, m.generation, 8);
  put(out, static_cast<std::uint32_t>(m.size), 4);
  put(out, m.root, 4);
  out.append(reinterpret_cast<const char*>(m.id.data()), m.id.size());
  return out;
}

result<nccl_id_message> decode_nccl_id_message(std::string_view bytes) {
  using r = result<nccl_id_message>;
  if (bytes.size() != message_bytes)
    return r::failure("nccl id message: " + std::to_string(bytes.size()) + " bytes, expected " +
                      std::to_string(message_bytes));
  if (std::memcmp(bytes.data(), tag, 4) != 0) return r::failure("nccl id message: bad tag");
  nccl_id_message m;
  m.instance = get(bytes, 4, 8);
  m.generation = get(bytes, 12, 8);
  m.size = static_cast<std::int32_t>(get(bytes, 20, 4));
  m.root = static_cast<gpu_id>(get(bytes, 24, 4));
  std::memcpy(m.id.data(), bytes.data() + 28, nccl_unique_id_bytes);
  return m;
}

result<comm_init_args> accept_unique_id(const ep_group_plan& plan, gpu_id self,
                                        const nccl_id_message& m) {
  using r = result<comm_init_args>;
  if (m.instance != plan.instance)
    return r::failure("unique id for instance " + std::to_string(m.instance) + ", this is " +
                      std::to_string(plan.instance));
  if (m.generation != plan.generation)
    return r::failure("unique id of generation " + std::to_string(m.generation) +
                      ", the group is at generation " + std::to_string(plan.generation));
  if (m.size != plan.size() || m.root != plan.root())
    return r::failure("unique id for a group of " + std::to_string(m.size) + " rooted at GPU " +
                      std::to_string(m.root) + ", the plan has " + std::to_string(plan.size()) +
                      " rooted at GPU " + std::to_string(plan.root()));
  const auto rank = plan.rank_of(self);
  if (rank < 0)
    return r::failure("GPU " + std::to_string(self) + " is not a member of generation " +
                      std::to_string(plan.generation));
  return comm_init_args{plan.size(), rank, m.id};
}

result<ep_rebuild> plan_rebuild(const ep_group_plan& from, const ep_group_plan& to,
                                bool communicator_alive) {
  using r = result<ep_rebuild>;
  if (from.instance != to.instance) return r::failure("plan_rebuild: two different instances");
  if (to.generation <= from.generation)
    return r::failure("plan_rebuild: generation " + std::to_string(to.generation) +
                      " does not follow " + std::to_string(from.generation));
  if (from.placement.experts != to.placement.experts)
    return r::failure("plan_rebuild: the expert count changed");
  ep_rebuild out;
  out.new_communicator = !communicator_alive || from.members != to.members;
  std::set_difference(from.members.begin(), from.members.end(), to.members.begin(),
                      to.members.end(), std::back_inserter(out.lost));
  std::set<std::int32_t> surviving;  // experts some member of `to` already held
  for (std::int32_t rank = 0; rank < to.size(); ++rank) {
    const gpu_id gpu = to.members[static_cast<std::size_t>(rank)];
    rank_rebuild rb;
    rb.gpu = gpu;
    rb.old_rank = from.rank_of(gpu);
    rb.new_rank = rank;
    const auto before = held(from, gpu), after = held(to, gpu);
    surviving.insert(before.begin(), before.end());
    std::set_difference(after.begin(), after.end(), before.begin(), before.end(),
                        std::back_inserter(rb.load));
    std::set_difference(before.begin(), before.end(), after.begin(), after.end(),
                        std::back_inserter(rb.drop));
    out.ranks.push_back(std::move(rb));
  }
  for (std::int32_t e = 0; e < to.placement.experts; ++e)
    if (!surviving.count(e)) out.from_checkpoint.push_back(e);
  return out;
}

}  // namespace troupe::kernels

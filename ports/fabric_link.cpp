#include "ports/fabric_link.hpp"
#include "ports/le_bytes.hpp"

#include "runtime/errors.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

namespace troupe::ports {

using runtime::errc;
using runtime::make_error;

namespace {

using steady = std::chrono::steady_clock;

// -- wire format ------------------------------------------------------------------------------
//
// Tags: bits 63..60 the kind, 59..20 the puller's sequence number of the pull, 19..0 the chunk
// index (data) or 0. Requests all carry the same tag, `request_tag`.
constexpr std::uint64_t kind_request = 1;
constexpr std::uint64_t kind_header = 2;
constexpr std::uint64_t kind_data = 3;
constexpr std::uint64_t seq_mask = (std::uint64_t{1} << 40) - 1;
constexpr std::uint64_t max_chunks = std::uint64_t{1} << 20;

constexpr std::uint64_t make_tag(std::uint64_t kind, std::uint64_t seq, std::uint64_t index) {
  return (kind << 60) | ((seq & seq_mask) << 20) | index;
}
constexpr std::uint64_t request_tag = make_tag(kind_request, 0, 0);

// A request, little-endian: magic u32 | version u32 | seq u64 | id u64 | capacity u64 |
// chunk u64 | address length u32 | address bytes.
constexpr std::uint32_t request_magic = 0x51465254; // "TRFQ"
constexpr std::uint32_t wire_version = 1;
constexpr std::size_t request_fixed = 44;
constexpr std::size_t request_buffer = 1024;
constexpr std::size_t max_address = request_buffer - request_fixed;
// A reply header: magic u32 | status u32 | size u64.
constexpr std::uint32_t header_magic = 0x48465254; // "TRFH"
constexpr std::size_t header_bytes = 16;
enum class reply_status : std::uint32_t { ok = 0, not_found = 1, too_big = 2 };

constexpr std::size_t request_posts = 16;
constexpr std::uint64_t default_chunk_cap = 64ull << 20;
// How long a closing endpoint waits for its cancelled receives and its sends to resolve.
constexpr std::chrono::milliseconds quiesce_limit{250};

std::string fi_message(int ret) {
  return fi_strerror(ret < 0 ? -ret : ret);
}

// What a completion belongs to. Every posted operation gets one of these as its context; the
// fi_context2 comes first, as FI_CONTEXT / FI_CONTEXT2 mode requires.
enum class op_kind : std::uint8_t { request_recv, serve_send, pull_send, pull_header, pull_data };

struct op_ctx {
  fi_context2 fctx{};
  op_kind kind = op_kind::request_recv;
  void* owner = nullptr;
  std::uint32_t index = 0;
  bool resolved = true;
};

// A slot that receives pull requests from peers.
struct request_slot {
  op_ctx ctx;
  std::array<std::uint8_t, request_buffer> buf{};
};

// The answer to one pull request: a header, then the data chunks, sent in order.
struct serve_op {
  std::uint64_t key = 0;
  fi_addr_t dest = FI_ADDR_UNSPEC;
  std::uint64_t seq = 0;
  std::uint64_t chunk = 0;
  std::array<std::uint8_t, header_bytes> header{};
  fabric_endpoint::bytes_ptr bytes;
  std::vector<op_ctx> ctxs; // 0: the header, 1..: data chunks
  std::size_t next = 0;     // the next send to post
  steady::time_point blocked_since = steady::now();
  std::size_t outstanding = 0;
};

// One pull in flight: a request send, a header receive and the data receives.
struct pull_op {
  std::uint64_t seq = 0;
  std::uint64_t id = 0;
  std::string peer;
  fi_addr_t dest = FI_ADDR_UNSPEC;
  runtime::duration timeout{};
  std::uint64_t chunk = 0;
  // Where the data lands: the caller's buffer, or (grow) `owned`, a buffer of the op's own
  // that no later round reuses: a receive being cancelled may still write into it until it
  // resolves, so the bytes reach the caller's string (`result`) only once every receive of
  // the op has resolved.
  char* dst = nullptr;
  std::uint64_t capacity = 0;
  bool grow = false;
  std::shared_ptr<std::string> owned;
  std::shared_ptr<std::string> result;
  std::vector<std::uint8_t> request;
  std::array<std::uint8_t, header_bytes> header{};
  std::vector<op_ctx> ctxs; // 0: request send, 1: header recv, 2..: data recvs
  std::size_t outstanding = 0;
  bool header_done = false;
  reply_status status = reply_status::ok;
  std::uint64_t size = 0;
  std::uint64_t chunks_expected = 0;
  std::uint64_t chunks_done = 0;
  std::uint64_t bytes_done = 0;
  steady::time_point deadline;
  steady::time_point cancel_at = steady::time_point::max();
  bool finished = false; // the callback has been called (or handed to a second round)
  bool cancelling = false;
  bool timing_out = false; // timed out; reported once the caller's buffer is released
  std::function<void(caf::error, std::uint64_t)> done;
};

struct pull_command {
  std::string peer;
  std::uint64_t id = 0;
  std::uint64_t expected = 0;
  runtime::duration timeout{};
  char* dst = nullptr;
  std::uint64_t capacity = 0;
  bool grow = false;
  std::shared_ptr<std::string> owned;
  std::function<void(caf::error, std::uint64_t)> done;
};

// shm endpoints closed in this process. libfabric 1.17's shm provider maps the region of a
// peer in the same process through the peer's own mapping, which closing that endpoint
// unmaps: a later send to it touches unmapped memory. Names are never reused within a process
// (pid:domain:index), so a pull from or an answer to one of these is refused up front. Peers in
// other processes are mapped separately and merely stop answering.
std::mutex closed_shm_mutex;
std::set<std::string> closed_shm_endpoints;

bool closed_in_process(const std::string& address) {
  std::lock_guard<std::mutex> guard{closed_shm_mutex};
  return closed_shm_endpoints.count(address) > 0;
}

template <class T>
void close_fid(T*& p) {
  if (p != nullptr) {
    fi_close(&p->fid);
    p = nullptr;
  }
}

} // namespace

struct fabric_endpoint::impl {
  fabric_params params;
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
  std::string address;
  std::string provider;
  std::uint64_t chunk = 0;

  // Shared with user threads.
  mutable std::mutex mtx;
  std::condition_variable wake;
  std::map<std::uint64_t, bytes_ptr> offers;
  std::deque<pull_command> commands;
  bool stopping = false;
  fabric_stats counters;
  std::thread thread;

  // Progress thread only.
  std::vector<std::unique_ptr<request_slot>> slots;
  std::unordered_map<std::string, fi_addr_t> peers;
  std::map<std::uint64_t, std::unique_ptr<serve_op>> serving;
  std::deque<serve_op*> blocked_sends; // serve ops with sends left to post (EAGAIN)
  std::map<std::uint64_t, std::unique_ptr<pull_op>> pulls;
  std::vector<std::unique_ptr<pull_op>> relaunch; // second rounds to launch
  std::deque<std::uint64_t> blocked_requests;       // pulls whose request got -FI_EAGAIN
  std::uint64_t next_seq = 1;
  std::uint64_t next_serve = 1;
  steady::time_point last_activity = steady::now();

  ~impl() {
    close_fid(ep);
    close_fid(av);
    close_fid(cq);
    close_fid(domain);
    close_fid(fabric);
    if (info != nullptr)
      fi_freeinfo(info);
  }

  caf::error fail(const std::string& what, int ret) const {
    return make_error(errc::unavailable, "fabric " + params.provider + ": " + what + ": "
                                           + fi_message(ret));
  }

  caf::error setup() {
    static const std::array<const char*, 5> known{"tcp", "shm", "verbs", "efa", "cxi"};
    if (std::find(known.begin(), known.end(), params.provider) == known.end())
      return make_error(errc::invalid_argument,
                        "fabric: unknown provider '" + params.provider
                          + "' (expected tcp, shm, verbs, efa or cxi)");
    fi_info* hints = fi_allocinfo();
    if (hints == nullptr)
      return make_error(errc::unavailable, "fabric: fi_allocinfo failed");
    hints->caps = FI_TAGGED | FI_SEND | FI_RECV;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(params.provider.c_str());
    const bool network = params.provider != "shm";
    const char* node = network && !params.host.empty() ? params.host.c_str() : nullptr;
    int ret = fi_getinfo(FI_VERSION(1, 9), node, node != nullptr ? "0" : nullptr,
                         node != nullptr ? FI_SOURCE : 0, hints, &info);
    fi_freeinfo(hints);
    if (ret != 0 || info == nullptr) {
      info = nullptr;
      return fail("no RDM endpoint with tagged messages"
                    + (node != nullptr ? " on " + params.host : std::string{}),
                  ret != 0 ? ret : -FI_ENODATA);
    }
    provider = info->fabric_attr->prov_name != nullptr ? info->fabric_attr->prov_name : "";
    std::uint64_t max_msg = info->ep_attr->max_msg_size;
    chunk = params.max_chunk_bytes != 0 ? params.max_chunk_bytes
                                        : std::min<std::uint64_t>(default_chunk_cap, max_msg);
    chunk = std::min(chunk, max_msg);
    if (chunk == 0)
      return make_error(errc::invalid_argument, "fabric: chunk size 0");
    if ((ret = fi_fabric(info->fabric_attr, &fabric, nullptr)) != 0)
      return fail("fi_fabric", ret);
    if ((ret = fi_domain(fabric, info, &domain, nullptr)) != 0)
      return fail("fi_domain", ret);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.size = 4096;
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((ret = fi_cq_open(domain, &cq_attr, &cq, nullptr)) != 0)
      return fail("fi_cq_open", ret);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    av_attr.count = 256;
    if ((ret = fi_av_open(domain, &av_attr, &av, nullptr)) != 0)
      return fail("fi_av_open", ret);
    if ((ret = fi_endpoint(domain, info, &ep, nullptr)) != 0)
      return fail("fi_endpoint", ret);
    if ((ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
      return fail("fi_ep_bind(cq)", ret);
    if ((ret = fi_ep_bind(ep, &av->fid, 0)) != 0)
      return fail("fi_ep_bind(av)", ret);
    if ((ret = fi_enable(ep)) != 0)
      return fail("fi_enable", ret);
    std::array<char, 512> name{};
    std::size_t len = name.size();
    if ((ret = fi_getname(&ep->fid, name.data(), &len)) != 0)
      return fail("fi_getname", ret);
    if (len > max_address)
      return make_error(errc::unavailable, "fabric " + params.provider + ": address of "
                                             + std::to_string(len) + " bytes is too long");
    address.assign(name.data(), len);
    for (std::size_t i = 0; i < request_posts; ++i) {
      auto slot = std::make_unique<request_slot>();
      slot->ctx.kind = op_kind::request_recv;
      slot->ctx.owner = slot.get();
      if (auto err = post_request_slot(*slot))
        return err;
      slots.push_back(std::move(slot));
    }
    return {};
  }

  caf::error post_request_slot(request_slot& slot) {
    for (int attempt = 0;; ++attempt) {
      auto ret = fi_trecv(ep, slot.buf.data(), slot.buf.size(), nullptr, FI_ADDR_UNSPEC,
                          request_tag, 0, &slot.ctx.fctx);
      if (ret == 0) {
        slot.ctx.resolved = false;
        return {};
      }
      if (ret != -FI_EAGAIN || attempt > 1000)
        return fail("fi_trecv(request)", static_cast<int>(ret));
      fi_cq_read(cq, nullptr, 0); // progress
    }
  }

  // -- peers ----------------------------------------------------------------------------------

  caf::expected<fi_addr_t> resolve(const std::string& peer) {
    if (params.provider == "shm" && closed_in_process(peer))
      return make_error(errc::unavailable, "fabric shm: the peer endpoint was closed");
    if (auto i = peers.find(peer); i != peers.end())
      return i->second;
    if (peer.empty() || peer.size() > max_address)
      return make_error(errc::unavailable, "fabric " + params.provider
                                             + ": malformed peer address ("
                                             + std::to_string(peer.size()) + " bytes)");
    fi_addr_t addr = FI_ADDR_UNSPEC;
    int ret = fi_av_insert(av, peer.data(), 1, &addr, 0, nullptr);
    if (ret != 1)
      return fail("fi_av_insert(peer)", ret < 0 ? ret : -FI_EINVAL);
    peers.emplace(peer, addr);
    return addr;
  }

  // -- serving --------------------------------------------------------------------------------

  void on_request(request_slot& slot, std::size_t len) {
    const std::uint8_t* p = slot.buf.data();
    bool valid = len >= request_fixed && get_u32(p) == request_magic
                 && get_u32(p + 4) == wire_version;
    std::uint32_t addr_len = valid ? get_u32(p + 40) : 0;
    valid = valid && request_fixed + addr_len <= len;
    valid = valid && get_u64(p + 32) != 0;
    if (valid) {
      std::uint64_t seq = get_u64(p + 8);
      std::uint64_t id = get_u64(p + 16);
      std::uint64_t capacity = get_u64(p + 24);
      std::uint64_t chunk_size = get_u64(p + 32);
      std::string peer(reinterpret_cast<const char*>(p + request_fixed), addr_len);
      serve(seq, id, capacity, chunk_size, peer);
    }
    if (stopping_now())
      return; // the endpoint closes: no more requests (quiesce)
    if (auto err = post_request_slot(slot))
      slot.ctx.resolved = true; // the slot is lost; the others keep serving
  }

  void serve(std::uint64_t seq, std::uint64_t id, std::uint64_t capacity,
             std::uint64_t chunk_size, const std::string& peer) {
    auto dest = resolve(peer);
    if (!dest)
      return; // nowhere to answer: the puller times out
    bytes_ptr bytes;
    {
      std::lock_guard<std::mutex> guard{mtx};
      if (auto i = offers.find(id); i != offers.end())
        bytes = i->second;
    }
    auto op = std::make_unique<serve_op>();
    op->key = next_serve++;
    op->dest = *dest;
    op->seq = seq;
    op->chunk = chunk_size; // the puller's receives are cut at its chunk size
    reply_status status = reply_status::ok;
    std::uint64_t size = 0;
    std::size_t nchunks = 0;
    if (!bytes) {
      status = reply_status::not_found;
    } else {
      size = bytes->size();
      nchunks = (size + op->chunk - 1) / op->chunk;
      if (size > capacity || nchunks > max_chunks)
        status = reply_status::too_big;
    }
    {
      std::lock_guard<std::mutex> guard{mtx};
      if (status == reply_status::not_found)
        ++counters.not_found;
      else if (status == reply_status::ok) {
        ++counters.served;
        counters.served_bytes += size;
      }
    }
    if (status != reply_status::ok)
      nchunks = 0;
    else
      op->bytes = std::move(bytes);
    put_u32(op->header.data(), header_magic);
    put_u32(op->header.data() + 4, static_cast<std::uint32_t>(status));
    put_u64(op->header.data() + 8, size);
    op->ctxs.resize(1 + nchunks);
    for (std::size_t i = 0; i < op->ctxs.size(); ++i) {
      op->ctxs[i].kind = op_kind::serve_send;
      op->ctxs[i].owner = op.get();
      op->ctxs[i].index = static_cast<std::uint32_t>(i);
    }
    auto* raw = op.get();
    serving.emplace(raw->key, std::move(op));
    note_sending();
    if (!post_sends(*raw))
      blocked_sends.push_back(raw);
  }

  // Posts the op's remaining sends; false if the provider pushed back (retry later).
  bool post_sends(serve_op& op) {
    while (op.next < op.ctxs.size()) {
      auto& ctx = op.ctxs[op.next];
      ssize_t ret;
      if (op.next == 0) {
        ret = fi_tsend(ep, op.header.data(), op.header.size(), nullptr, op.dest,
                       make_tag(kind_header, op.seq, 0), &ctx.fctx);
      } else {
        std::uint64_t index = op.next - 1;
        std::uint64_t offset = index * op.chunk;
        std::uint64_t len = std::min<std::uint64_t>(op.chunk, op.bytes->size() - offset);
        ret = fi_tsend(ep, op.bytes->data() + offset, len, nullptr, op.dest,
                       make_tag(kind_data, op.seq, index), &ctx.fctx);
      }
      if (ret == -FI_EAGAIN)
        return false;
      if (ret != 0) {
        op.ctxs.resize(op.next); // give up the rest: the puller times out
        break;
      }
      ctx.resolved = false;
      ++op.outstanding;
      ++op.next;
    }
    maybe_retire(op);
    return true;
  }

  // Retries every serve op the provider pushed back on; one that stays blocked longer than
  // the linger (a puller that died: shm never frees its queue) is abandoned. True if any
  // made progress.
  bool retry_sends() {
    bool progress = false;
    auto now = steady::now();
    std::size_t n = blocked_sends.size();
    for (std::size_t k = 0; k < n; ++k) {
      auto* op = blocked_sends.front();
      blocked_sends.pop_front();
      auto before = op->next;
      if (post_sends(*op)) {
        progress = true;
        continue;
      }
      if (op->next != before) {
        progress = true;
        op->blocked_since = now;
      }
      if (now - op->blocked_since > std::chrono::duration_cast<steady::duration>(params.linger)) {
        op->ctxs.resize(op->next); // give up the rest: the puller times out
        maybe_retire(*op);
        continue;
      }
      blocked_sends.push_back(op);
    }
    return progress;
  }

  // Publishes how many answers are being sent (counters.sending).
  void note_sending() {
    std::lock_guard<std::mutex> guard{mtx};
    counters.sending = serving.size();
  }

  void maybe_retire(serve_op& op) {
    if (op.next >= op.ctxs.size() && op.outstanding == 0) {
      serving.erase(op.key); // destroys op
      note_sending();
    }
  }

  void on_serve_send(op_ctx& ctx) {
    auto& op = *static_cast<serve_op*>(ctx.owner);
    ctx.resolved = true;
    --op.outstanding;
    maybe_retire(op);
  }

  // -- pulling --------------------------------------------------------------------------------

  void start_pull(pull_command cmd) {
    auto dest = resolve(cmd.peer);
    if (!dest) {
      finish_command(cmd, std::move(dest.error()), 0);
      return;
    }
    auto op = std::make_unique<pull_op>();
    op->seq = next_seq++;
    op->id = cmd.id;
    op->peer = std::move(cmd.peer);
    op->dest = *dest;
    op->timeout = cmd.timeout;
    op->chunk = chunk;
    op->grow = cmd.grow;
    op->done = std::move(cmd.done);
    op->deadline = steady::now() + std::chrono::duration_cast<steady::duration>(cmd.timeout);
    if (op->grow) {
      std::uint64_t room = cmd.expected != 0 ? cmd.expected : params.default_pull_bytes;
      op->result = std::move(cmd.owned);
      op->owned = std::make_shared<std::string>();
      op->owned->resize(room);
      op->dst = op->owned->data();
      op->capacity = room;
    } else {
      op->dst = cmd.dst;
      op->capacity = cmd.capacity;
    }
    launch(std::move(op));
  }

  void finish_command(pull_command& cmd, caf::error err, std::uint64_t size) {
    count_pull(err);
    cmd.done(std::move(err), size);
  }

  void count_pull(const caf::error& err) {
    std::lock_guard<std::mutex> guard{mtx};
    if (err)
      ++counters.pulls_failed;
    else
      ++counters.pulls_ok;
  }

  // Posts the receives of `op`, then its request.
  void launch(std::unique_ptr<pull_op> op) {
    std::uint64_t nchunks = (op->capacity + op->chunk - 1) / op->chunk;
    if (nchunks > max_chunks) {
      auto done = std::move(op->done);
      auto err = make_error(errc::invalid_argument, "fabric: a pull of "
                                                      + std::to_string(op->capacity)
                                                      + " bytes needs too many chunks");
      count_pull(err);
      done(std::move(err), 0);
      return;
    }
    op->ctxs.resize(2 + nchunks);
    for (std::size_t i = 0; i < op->ctxs.size(); ++i) {
      op->ctxs[i].owner = op.get();
      op->ctxs[i].index = static_cast<std::uint32_t>(i);
      op->ctxs[i].kind = i == 0 ? op_kind::pull_send
                                : (i == 1 ? op_kind::pull_header : op_kind::pull_data);
    }
    auto* raw = op.get();
    pulls.emplace(raw->seq, std::move(op));
    auto& o = *raw;
    // Receives first, so the reply never arrives unexpected.
    caf::error err;
    if (auto ret = post_recv(o, 1, o.header.data(), o.header.size(),
                             make_tag(kind_header, o.seq, 0));
        ret != 0)
      err = fail("fi_trecv(header)", static_cast<int>(ret));
    for (std::uint64_t i = 0; !err && i < nchunks; ++i) {
      std::uint64_t offset = i * o.chunk;
      std::uint64_t len = std::min(o.chunk, o.capacity - offset);
      if (auto ret = post_recv(o, 2 + i, o.dst + offset, len, make_tag(kind_data, o.seq, i));
          ret != 0)
        err = fail("fi_trecv(data)", static_cast<int>(ret));
    }
    if (!err) {
      o.request.resize(request_fixed + address.size());
      auto* p = o.request.data();
      put_u32(p, request_magic);
      put_u32(p + 4, wire_version);
      put_u64(p + 8, o.seq);
      put_u64(p + 16, o.id);
      put_u64(p + 24, o.capacity);
      put_u64(p + 32, o.chunk);
      put_u32(p + 40, static_cast<std::uint32_t>(address.size()));
      std::memcpy(p + request_fixed, address.data(), address.size());
      if (!send_request(o))
        blocked_requests.push_back(o.seq); // retried by the loop until the deadline
      return;
    }
    if (err) {
      deliver(o, std::move(err));
      cancel(o);
      maybe_drop(o);
    }
  }

  // Tries to send the op's request; false on -FI_EAGAIN (the provider is busy, or still
  // connecting to the peer). Any other failure fails the pull.
  bool send_request(pull_op& o) {
    auto ret = fi_tsend(ep, o.request.data(), o.request.size(), nullptr, o.dest, request_tag,
                        &o.ctxs[0].fctx);
    if (ret == -FI_EAGAIN)
      return false;
    if (ret != 0) {
      deliver(o, make_error(errc::unavailable, "fabric " + params.provider
                                                 + ": cannot send the pull request: "
                                                 + fi_message(static_cast<int>(ret))));
      cancel(o);
      maybe_drop(o);
      return true;
    }
    o.ctxs[0].resolved = false;
    ++o.outstanding;
    return true;
  }

  void retry_requests() {
    std::size_t n = blocked_requests.size();
    for (std::size_t k = 0; k < n; ++k) {
      auto seq = blocked_requests.front();
      blocked_requests.pop_front();
      auto i = pulls.find(seq);
      if (i == pulls.end() || i->second->finished || i->second->timing_out)
        continue; // gone, or timed out meanwhile (its receives are being cancelled)
      if (!send_request(*i->second))
        blocked_requests.push_back(seq);
    }
  }

  ssize_t post_recv(pull_op& op, std::size_t index, void* buf, std::size_t len,
                    std::uint64_t tag) {
    ssize_t ret;
    int spins = 0;
    while ((ret = fi_trecv(ep, buf, len, nullptr, FI_ADDR_UNSPEC, tag, 0,
                           &op.ctxs[index].fctx))
             == -FI_EAGAIN
           && ++spins < 100000)
      poll_once();
    if (ret == 0) {
      op.ctxs[index].resolved = false;
      ++op.outstanding;
    }
    return ret;
  }

  // Calls the op's callback (once).
  void deliver(pull_op& op, caf::error err) {
    if (op.finished)
      return;
    op.finished = true;
    count_pull(err);
    std::uint64_t size = err ? 0 : op.size;
    auto done = std::move(op.done);
    done(std::move(err), size);
  }

  // Cancels every receive still posted; the op goes when all are resolved (the caller calls
  // maybe_drop when it no longer touches the op).
  void cancel(pull_op& op) {
    op.cancelling = true;
    for (std::size_t i = 1; i < op.ctxs.size(); ++i)
      if (!op.ctxs[i].resolved)
        fi_cancel(&ep->fid, &op.ctxs[i].fctx);
  }

  void maybe_drop(pull_op& op) {
    if (op.finished && op.outstanding == 0)
      pulls.erase(op.seq);
  }

  void on_pull_completion(op_ctx& ctx, const fi_cq_tagged_entry* entry, int error) {
    auto& op = *static_cast<pull_op*>(ctx.owner);
    ctx.resolved = true;
    --op.outstanding;
    if (error != 0) {
      if (ctx.kind == op_kind::pull_send && !op.finished) {
        deliver(op, make_error(errc::unavailable, "fabric " + params.provider
                                                    + ": peer unreachable: "
                                                    + fi_message(error)));
        cancel(op);
      } else if (error != FI_ECANCELED && !op.finished) {
        deliver(op, make_error(errc::unavailable, "fabric " + params.provider
                                                    + ": receive failed: "
                                                    + fi_message(error)));
        cancel(op);
      }
      check_complete(op); // a cancelled surplus receive may have been the last one
      report_timeout(op);
      maybe_drop(op);
      return;
    }
    switch (ctx.kind) {
      case op_kind::pull_header:
        on_header(op, entry->len);
        break;
      case op_kind::pull_data:
        ++op.chunks_done;
        op.bytes_done += entry->len;
        break;
      default:
        break;
    }
    check_complete(op);
    report_timeout(op);
    maybe_drop(op);
  }

  void on_header(pull_op& op, std::size_t len) {
    const auto* p = op.header.data();
    if (len != header_bytes || get_u32(p) != header_magic) {
      deliver(op, make_error(errc::unavailable, "fabric: malformed reply header"));
      cancel(op);
      return;
    }
    op.header_done = true;
    op.status = static_cast<reply_status>(get_u32(p + 4));
    op.size = get_u64(p + 8);
    if (op.finished)
      return; // a late reply after a timeout: let the receives resolve
    switch (op.status) {
      case reply_status::ok: {
        op.chunks_expected = (op.size + op.chunk - 1) / op.chunk;
        // Receives beyond the data will never match: cancel them.
        for (std::size_t i = 2 + op.chunks_expected; i < op.ctxs.size(); ++i)
          if (!op.ctxs[i].resolved)
            fi_cancel(&ep->fid, &op.ctxs[i].fctx);
        break;
      }
      case reply_status::not_found:
        deliver(op, make_error(errc::not_found, "fabric: the peer has no offer "
                                                  + std::to_string(op.id)));
        cancel(op);
        break;
      case reply_status::too_big:
        second_round(op);
        break;
      default:
        deliver(op, make_error(errc::unavailable, "fabric: unknown reply status"));
        cancel(op);
    }
  }

  void second_round(pull_op& op) {
    if (!op.grow) {
      deliver(op, make_error(errc::invalid_argument,
                             "fabric: offer " + std::to_string(op.id) + " has "
                               + std::to_string(op.size) + " bytes, the buffer "
                               + std::to_string(op.capacity)));
      cancel(op);
      return;
    }
    {
      std::lock_guard<std::mutex> guard{mtx};
      ++counters.second_rounds;
    }
    // A new op with a buffer of the exact size; the old one keeps its (small) receives until
    // their cancellation completes and hands its callback over (so the pull counts once).
    auto next = std::make_unique<pull_op>();
    next->seq = next_seq++;
    next->id = op.id;
    next->peer = op.peer;
    next->dest = op.dest;
    next->timeout = op.timeout;
    next->chunk = op.chunk;
    next->grow = true;
    next->deadline = op.deadline;
    next->owned = std::make_shared<std::string>();
    next->owned->resize(op.size);
    next->dst = next->owned->data();
    next->capacity = op.size;
    // The old op keeps its own buffer until its receives resolve; the new one delivers into
    // the caller's string.
    next->result = op.result;
    next->done = std::move(op.done);
    op.finished = true;
    cancel(op);
    relaunch.push_back(std::move(next)); // launched by the loop, outside this completion
  }

  void check_complete(pull_op& op) {
    if (op.finished || !op.header_done || op.status != reply_status::ok)
      return;
    if (op.chunks_done < op.chunks_expected)
      return;
    // Wait until the surplus receives are cancelled, so no provider still holds the buffer.
    for (std::size_t i = 1; i < op.ctxs.size(); ++i)
      if (!op.ctxs[i].resolved)
        return;
    if (op.bytes_done != op.size) {
      deliver(op, make_error(errc::unavailable, "fabric: received " + std::to_string(op.bytes_done)
                                                  + " bytes of " + std::to_string(op.size)));
      return;
    }
    if (op.grow) {
      op.owned->resize(op.size);
      *op.result = std::move(*op.owned);
    }
    deliver(op, {});
  }

  // -- the progress loop ----------------------------------------------------------------------

  // Reads completions; returns how many it handled.
  int poll_once() {
    std::array<fi_cq_tagged_entry, 32> entries;
    ssize_t n = fi_cq_read(cq, entries.data(), entries.size());
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i)
        dispatch(static_cast<op_ctx*>(entries[i].op_context), &entries[i], 0);
      return static_cast<int>(n);
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq, &err, 0) > 0) {
      dispatch(static_cast<op_ctx*>(err.op_context), nullptr, err.err != 0 ? err.err : 1);
        return 1;
      }
    }
    return 0;
  }

  void dispatch(op_ctx* ctx, const fi_cq_tagged_entry* entry, int error) {
    if (ctx == nullptr)
      return;
    switch (ctx->kind) {
      case op_kind::request_recv: {
        auto& slot = *static_cast<request_slot*>(ctx->owner);
        ctx->resolved = true;
        if (error == 0)
          on_request(slot, entry->len);
        else if (error != FI_ECANCELED && !stopping_now())
          post_request_slot(slot);
        break;
      }
      case op_kind::serve_send:
        on_serve_send(*ctx);
        break;
      default:
        on_pull_completion(*ctx, entry, error);
    }
  }

  bool stopping_now() {
    std::lock_guard<std::mutex> guard{mtx};
    return stopping;
  }

  void check_deadlines(steady::time_point now) {
    std::vector<pull_op*> expired;
    for (auto& [seq, op] : pulls) {
      if (!op->finished && !op->timing_out && now >= op->deadline)
        expired.push_back(op.get());
      else if (op->finished && !op->cancelling && now >= op->cancel_at)
        expired.push_back(op.get());
    }
    for (auto* op : expired) {
      if (!op->finished && !op->grow) {
        // The caller's buffer: cancel now, report when no receive can write into it.
        if (!op->timing_out) {
          op->timing_out = true;
          cancel(*op);
          report_timeout(*op);
          maybe_drop(*op);
        }
      } else if (!op->finished) {
        deliver(*op, timeout_error(*op));
        op->cancel_at = now + std::chrono::duration_cast<steady::duration>(params.linger);
        maybe_drop(*op);
      } else {
        cancel(*op);
        maybe_drop(*op);
      }
    }
  }

  caf::error timeout_error(const pull_op& op) const {
    return caf::make_error(caf::sec::request_timeout,
                           "fabric " + params.provider + ": pull of offer "
                             + std::to_string(op.id) + " timed out");
  }

  // For a timed-out pull into the caller's buffer: reports the timeout once every receive
  // is resolved (cancelled, or completed by a late reply).
  void report_timeout(pull_op& op) {
    if (!op.timing_out || op.finished)
      return;
    for (std::size_t i = 1; i < op.ctxs.size(); ++i)
      if (!op.ctxs[i].resolved)
        return;
    deliver(op, timeout_error(op));
  }

  void run() {
    auto last_deadline_check = steady::now();
    for (;;) {
      std::deque<pull_command> todo;
      {
        std::lock_guard<std::mutex> guard{mtx};
        if (stopping)
          break;
        todo.swap(commands);
      }
      bool worked = !todo.empty();
      for (auto& cmd : todo)
        start_pull(std::move(cmd));
      for (int i = 0; i < 64; ++i) {
        int n = poll_once();
        if (n == 0)
          break;
        worked = true;
      }
      if (!relaunch.empty()) {
        auto ops = std::move(relaunch);
        relaunch.clear();
        for (auto& op : ops)
          launch(std::move(op));
        worked = true;
      }
      if (!blocked_requests.empty())
        retry_requests();
      if (!blocked_sends.empty() && retry_sends())
        worked = true;
      auto now = steady::now();
      if (worked)
        last_activity = now;
      if (now - last_deadline_check > std::chrono::milliseconds(1)) {
        check_deadlines(now);
        last_deadline_check = now;
      }
      auto idle = now - last_activity;
      if (idle < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
      } else {
        auto nap = idle < std::chrono::milliseconds(50) ? std::chrono::microseconds(20)
                                                        : std::chrono::microseconds(250);
        std::unique_lock<std::mutex> lock{mtx};
        wake.wait_for(lock, nap, [this] { return stopping || !commands.empty(); });
      }
    }
    shutdown();
  }

  // Whether the provider may still complete an operation of this endpoint (and so touch its
  // context or buffer).
  bool anything_posted() const {
    for (const auto& slot : slots)
      if (!slot->ctx.resolved)
        return true;
    for (const auto& [seq, op] : pulls)
      if (op->outstanding > 0)
        return true;
    for (const auto& [key, op] : serving)
      if (op->outstanding > 0)
        return true;
    return false;
  }

  // Before the close: cancels every receive still posted (the request slots' and the pulls')
  // and reads completions until they and the sends in flight have resolved, for at most
  // quiesce_limit. libfabric 1.17's rxm over tcp crashed in fi_close on an endpoint whose
  // pulls still had receives posted (the ports test "closing an endpoint ... pulls in flight").
  void quiesce() {
    for (auto& slot : slots)
      if (!slot->ctx.resolved)
        fi_cancel(&ep->fid, &slot->ctx.fctx);
    for (auto& [seq, op] : pulls)
      cancel(*op);
    blocked_sends.clear();  // answers not posted yet stay unsent
    const auto deadline = steady::now() + quiesce_limit;
    while (anything_posted() && steady::now() < deadline)
      if (poll_once() == 0)
        std::this_thread::yield();
  }

  void shutdown() {
    quiesce();
    if (params.provider == "shm") {
      std::lock_guard<std::mutex> guard{closed_shm_mutex};
      closed_shm_endpoints.insert(address);
    }
    // Closing the endpoint drops every posted operation; nothing touches the buffers after.
    close_fid(ep);
    for (auto& op : relaunch)
      deliver(*op, make_error(errc::unavailable, "fabric: endpoint closed"));
    relaunch.clear();
    for (auto& [seq, op] : pulls)
      if (!op->finished)
        deliver(*op, make_error(errc::unavailable, "fabric: endpoint closed"));
    pulls.clear();
    serving.clear();
    note_sending();
    blocked_sends.clear();
  }

  void submit(pull_command cmd) {
    {
      std::lock_guard<std::mutex> guard{mtx};
      if (!stopping) {
        commands.push_back(std::move(cmd));
        wake.notify_one();
        return;
      }
    }
    count_pull(make_error(errc::unavailable));
    cmd.done(make_error(errc::unavailable, "fabric: endpoint closed"), 0);
  }
};

// -- fabric_endpoint -------------------------------------------------------------------------

fabric_endpoint::fabric_endpoint(std::unique_ptr<impl> p) : impl_(std::move(p)) {
}

caf::expected<std::unique_ptr<fabric_endpoint>> fabric_endpoint::open(fabric_params params) {
  auto p = std::make_unique<impl>();
  p->params = std::move(params);
  if (auto err = p->setup())
    return err;
  auto* raw = p.get();
  std::unique_ptr<fabric_endpoint> result{new fabric_endpoint(std::move(p))};
  raw->thread = std::thread([raw] { raw->run(); });
  return result;
}

fabric_endpoint::~fabric_endpoint() {
  {
    std::lock_guard<std::mutex> guard{impl_->mtx};
    impl_->stopping = true;
    impl_->wake.notify_one();
  }
  if (impl_->thread.joinable())
    impl_->thread.join();
  // Commands that arrived after the loop's last look.
  for (auto& cmd : impl_->commands)
    cmd.done(make_error(errc::unavailable, "fabric: endpoint closed"), 0);
}

const std::string& fabric_endpoint::address() const {
  return impl_->address;
}

const std::string& fabric_endpoint::provider_name() const {
  return impl_->provider;
}

std::uint64_t fabric_endpoint::chunk_bytes() const {
  return impl_->chunk;
}

runtime::fabric_ticket fabric_endpoint::offer(std::uint64_t id, bytes_ptr bytes) {
  runtime::fabric_ticket ticket{impl_->address, id, bytes ? bytes->size() : 0};
  std::lock_guard<std::mutex> guard{impl_->mtx};
  if (!bytes)
    bytes = std::make_shared<const std::string>();
  impl_->offers[id] = std::move(bytes);
  impl_->counters.offers = impl_->offers.size();
  return ticket;
}

bool fabric_endpoint::withdraw(std::uint64_t id) {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  bool erased = impl_->offers.erase(id) > 0;
  impl_->counters.offers = impl_->offers.size();
  return erased;
}

void fabric_endpoint::pull_async(std::string peer, std::uint64_t id,
                                 std::uint64_t expected_bytes, runtime::duration timeout,
                                 pull_callback done) {
  pull_command cmd;
  cmd.peer = std::move(peer);
  cmd.id = id;
  cmd.expected = expected_bytes;
  cmd.timeout = timeout;
  cmd.grow = true;
  cmd.owned = std::make_shared<std::string>();
  auto owned = cmd.owned;
  cmd.done = [owned, done = std::move(done)](caf::error err, std::uint64_t) {
    if (err)
      done(std::move(err));
    else
      done(std::move(*owned));
  };
  impl_->submit(std::move(cmd));
}

void fabric_endpoint::pull_into_async(std::string peer, std::uint64_t id, char* dst,
                                      std::uint64_t capacity, runtime::duration timeout,
                                      std::function<void(caf::expected<std::uint64_t>)> done) {
  pull_command cmd;
  cmd.peer = std::move(peer);
  cmd.id = id;
  cmd.timeout = timeout;
  cmd.dst = dst;
  cmd.capacity = capacity;
  cmd.done = [done = std::move(done)](caf::error err, std::uint64_t size) {
    if (err)
      done(std::move(err));
    else
      done(size);
  };
  impl_->submit(std::move(cmd));
}

caf::expected<std::string> fabric_endpoint::pull(const std::string& peer, std::uint64_t id,
                                                 std::uint64_t expected_bytes,
                                                 runtime::duration timeout) {
  std::promise<caf::expected<std::string>> promise;
  auto future = promise.get_future();
  pull_async(peer, id, expected_bytes, timeout,
             [&promise](caf::expected<std::string> r) { promise.set_value(std::move(r)); });
  return future.get();
}

fabric_stats fabric_endpoint::stats() const {
  std::lock_guard<std::mutex> guard{impl_->mtx};
  return impl_->counters;
}

// -- the port actor ---------------------------------------------------------------------------

namespace {

// A pull's outcome, sent by the progress thread to the port actor (never leaves the process).
struct fabric_pull_done {
  std::uint64_t token = 0;
  std::string bytes;
  caf::error error;
};

} // namespace
} // namespace troupe::ports

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::ports::fabric_pull_done)

namespace troupe::ports {
namespace {

using link_impl = runtime::fabric_link_port::extend<caf::reacts_to<fabric_pull_done>>;

struct link_state {
  /// A pull on its way: the offer's id, whom to tell once it has the bytes (the ticket's
  /// confirm_to), and the promise to the caller.
  struct pending_pull {
    std::uint64_t id = 0;
    caf::strong_actor_ptr confirm_to;
    caf::typed_response_promise<runtime::fabric_pulled> rp;
  };
  std::shared_ptr<fabric_endpoint> endpoint;
  std::map<std::uint64_t, pending_pull> pending;
  std::uint64_t next_token = 1;
  static inline const char* name = "fabric_link";
};

link_impl::behavior_type fabric_link_fn(link_impl::stateful_pointer<link_state> self,
                                        std::shared_ptr<fabric_endpoint> endpoint) {
  self->state.endpoint = std::move(endpoint);
  return {
    [=](runtime::fabric_offer& x) -> runtime::fabric_ticket {
      auto bytes = std::make_shared<const std::string>(std::move(x.bytes));
      auto ticket = self->state.endpoint->offer(x.id, std::move(bytes));
      if (x.once)
        ticket.confirm_to = caf::actor_cast<caf::strong_actor_ptr>(self);
      return ticket;
    },
    [=](const runtime::fabric_withdraw& x) -> bool {
      return self->state.endpoint->withdraw(x.id);
    },
    [=](caf::get_atom) -> runtime::fabric_activity {
      auto s = self->state.endpoint->stats();
      return {s.offers, s.served, s.sending};
    },
    [=](runtime::fabric_pull& x) -> caf::typed_response_promise<runtime::fabric_pulled> {
      auto rp = self->make_response_promise<runtime::fabric_pulled>();
      auto token = self->state.next_token++;
      self->state.pending.emplace(token,
                                  link_state::pending_pull{x.ticket.id, x.ticket.confirm_to, rp});
      auto weak = caf::actor_cast<caf::weak_actor_ptr>(self);
      self->state.endpoint->pull_async(
        std::move(x.ticket.address), x.ticket.id, x.ticket.bytes, x.timeout,
        [weak, token](caf::expected<std::string> r) {
          // On the progress thread: hand the outcome to the actor by message.
          auto strong = weak.lock();
          if (!strong)
            return;
          fabric_pull_done msg;
          msg.token = token;
          if (r)
            msg.bytes = std::move(*r);
          else
            msg.error = std::move(r.error());
          caf::anon_send(caf::actor_cast<link_impl>(strong), std::move(msg));
        });
      return rp;
    },
    [=](fabric_pull_done& x) {
      auto i = self->state.pending.find(x.token);
      if (i == self->state.pending.end())
        return;
      auto p = std::move(i->second);
      self->state.pending.erase(i);
      if (x.error) {
        p.rp.deliver(std::move(x.error));
        return;
      }
      // A hand-off made once: the offering port may let it go now (anonymously: its answer
      // is not wanted).
      if (p.confirm_to)
        caf::anon_send(caf::actor_cast<caf::actor>(p.confirm_to), runtime::fabric_withdraw{p.id});
      p.rp.deliver(runtime::fabric_pulled{p.id, std::move(x.bytes)});
    },
  };
}

} // namespace

caf::expected<runtime::fabric_link_port> spawn_fabric_link(caf::actor_system& sys,
                                                           fabric_params params) {
  auto endpoint = fabric_endpoint::open(std::move(params));
  if (!endpoint)
    return std::move(endpoint.error());
  std::shared_ptr<fabric_endpoint> shared{std::move(*endpoint)};
  runtime::fabric_link_port port = sys.spawn(fabric_link_fn, std::move(shared));
  return port;
}

} // namespace troupe::ports

#include "cluster/launch/block_fetcher.hpp"

#include "runtime/errors.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace troupe::cluster {

namespace {

/// A mapping of a POSIX shared memory segment, unmapped when destroyed.
class shm_mapping {
public:
  shm_mapping() = default;
  shm_mapping(const shm_mapping&) = delete;
  shm_mapping& operator=(const shm_mapping&) = delete;
  ~shm_mapping() {
    if (data_ != nullptr)
      ::munmap(data_, size_);
  }

  /// Creates segment `name` of `size` bytes (replacing none: it must be new) and maps it.
  static caf::expected<std::shared_ptr<shm_mapping>> create(const std::string& name,
                                                            std::size_t size) {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
      return failed("create", name);
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      auto e = failed("size", name);
      ::close(fd);
      ::shm_unlink(name.c_str());
      return e;
    }
    return map(fd, name, size, true);
  }

  /// Maps existing segment `name` of `size` bytes.
  static caf::expected<std::shared_ptr<shm_mapping>> open(const std::string& name,
                                                          std::size_t size) {
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0)
      return failed("open", name);
    return map(fd, name, size, false);
  }

  std::uint8_t* data() const { return data_; }

private:
  static caf::error failed(const char* what, const std::string& name) {
    return runtime::make_error(runtime::errc::unavailable,
                               std::string("cannot ") + what + " the shared memory segment "
                                 + name + ": " + std::strerror(errno));
  }

  static caf::expected<std::shared_ptr<shm_mapping>> map(int fd, const std::string& name,
                                                         std::size_t size, bool created) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    auto e = p == MAP_FAILED ? failed("map", name) : caf::error{};
    ::close(fd);
    if (p == MAP_FAILED) {
      if (created)
        ::shm_unlink(name.c_str());
      return e;
    }
    auto m = std::make_shared<shm_mapping>();
    m->data_ = static_cast<std::uint8_t*>(p);
    m->size_ = size;
    return m;
  }

  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A client's segment in the fetcher: its mapping, free slots and the fetches waiting for one.
struct client_segment {
  std::shared_ptr<shm_mapping> memory;
  std::uint64_t slot_bytes = 0;
  caf::actor_addr client;
  std::vector<std::uint32_t> free;
  std::deque<std::function<void(std::uint32_t)>> waiting;

  /// `slot` is free again: the first waiting fetch takes it.
  void give_back(std::uint32_t slot) {
    if (waiting.empty()) {
      free.push_back(slot);
      return;
    }
    auto w = std::move(waiting.front());
    waiting.pop_front();
    w(slot);
  }
};

} // namespace

caf::actor spawn_fetcher_registry(caf::actor_system& sys) {
  struct state {
    std::map<std::string, caf::actor> fetchers;
    std::multimap<std::string, caf::actor> subscribers;
  };
  return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    auto st = std::make_shared<state>();
    auto tell = [self, st](const std::string& name) {
      auto f = st->fetchers.count(name) != 0 ? st->fetchers.at(name) : caf::actor{};
      auto [from, to] = st->subscribers.equal_range(name);
      for (auto i = from; i != to; ++i)
        self->send(i->second, caf::put_atom::value, name, f);
    };
    self->set_down_handler([st, tell](caf::down_msg& m) {
      for (auto i = st->subscribers.begin(); i != st->subscribers.end();)
        i = i->second.address() == m.source ? st->subscribers.erase(i) : std::next(i);
      for (auto i = st->fetchers.begin(); i != st->fetchers.end();) {
        if (i->second.address() != m.source) {
          ++i;
          continue;
        }
        auto name = i->first;
        i = st->fetchers.erase(i);
        tell(name);
      }
    });
    return {
      [self, st, tell](caf::put_atom, const std::string& name, const caf::actor& fetcher) {
        if (!fetcher)
          return;
        self->monitor(fetcher);
        st->fetchers[name] = fetcher;
        tell(name);
      },
      [self, st](caf::join_atom, const std::string& name, const caf::actor& subscriber) {
        self->monitor(subscriber);
        st->subscribers.emplace(name, subscriber);
        auto f = st->fetchers.count(name) != 0 ? st->fetchers.at(name) : caf::actor{};
        self->send(subscriber, caf::put_atom::value, name, f);
      },
    };
  });
}

caf::actor spawn_block_fetcher(caf::actor_system& sys, runtime::store_port store,
                               std::shared_ptr<fetch_counters> counters) {
  if (!counters)
    counters = std::make_shared<fetch_counters>();
  return sys.spawn([store, counters](caf::event_based_actor* self) -> caf::behavior {
    auto segments = std::make_shared<std::map<std::string, client_segment>>();
    auto next = std::make_shared<std::uint64_t>(0);
    // A client gone: its segment goes (its fetches in flight find no segment and answer so),
    // and so does its name, in case the client never mapped it (it removes the name when it
    // does). The same for every segment when the fetcher ends.
    self->set_down_handler([segments](caf::down_msg& m) {
      for (auto i = segments->begin(); i != segments->end();) {
        if (i->second.client != m.source) {
          ++i;
          continue;
        }
        ::shm_unlink(i->first.c_str());
        i = segments->erase(i);
      }
    });
    self->attach_functor([segments] {
      for (const auto& [name, seg] : *segments)
        ::shm_unlink(name.c_str());
    });
    return {
      [self, segments, next](const fetcher_join& j) -> caf::result<fetcher_segment> {
        if (j.slot_bytes == 0 || j.slots == 0)
          return runtime::make_error(runtime::errc::invalid_argument,
                                     "a fetcher segment needs slots of at least one byte");
        auto name = "/troupe-fetch-" + std::to_string(::getpid()) + "-" + std::to_string(++*next);
        auto memory = shm_mapping::create(name, j.slot_bytes * j.slots);
        if (!memory)
          return memory.error();
        client_segment seg;
        seg.memory = std::move(*memory);
        seg.slot_bytes = j.slot_bytes;
        auto client = caf::actor_cast<caf::actor>(self->current_sender());
        if (client) {
          seg.client = client.address();
          self->monitor(client);
        }
        for (std::uint32_t s = j.slots; s > 0; --s)
          seg.free.push_back(s - 1);
        segments->emplace(name, std::move(seg));
        return fetcher_segment{name, j.slot_bytes, j.slots};
      },
      [self, segments, store, counters](const fetch_block& f) -> caf::result<fetched_block> {
        auto it = segments->find(f.segment);
        if (it == segments->end())
          return runtime::make_error(runtime::errc::invalid_argument,
                                     "no segment " + f.segment + " at this fetcher (join first)");
        auto rp = self->make_response_promise<fetched_block>();
        auto name = f.segment;
        auto key = f.key;
        auto with_slot = [self, segments, store, counters, rp, name,
                          key](std::uint32_t slot) mutable {
          self->request(store, std::chrono::seconds(60), runtime::store_get{key})
            .then(
              [segments, counters, rp, name, slot](runtime::store_object& o) mutable {
                auto it = segments->find(name);
                if (it == segments->end())
                  return;  // the client is gone
                auto& seg = it->second;
                if (o.payload.size() > seg.slot_bytes) {
                  seg.give_back(slot);
                  rp.deliver(runtime::make_error(
                    runtime::errc::invalid_argument,
                    "block " + runtime::to_string(o.key) + " has " + std::to_string(o.payload.size())
                      + " bytes, more than a slot (" + std::to_string(seg.slot_bytes) + ")"));
                  return;
                }
                std::memcpy(seg.memory->data() + slot * seg.slot_bytes, o.payload.data(),
                            o.payload.size());
                counters->fetched += 1;
                counters->bytes += o.payload.size();
                rp.deliver(fetched_block{o.key, o.size, o.checksum, slot});
              },
              [segments, rp, name, slot](caf::error& e) mutable {
                // The slot was never handed out: free it for the next fetch.
                if (auto it = segments->find(name); it != segments->end())
                  it->second.give_back(slot);
                rp.deliver(std::move(e));
              });
        };
        auto& seg = it->second;
        if (seg.free.empty()) {
          seg.waiting.push_back(std::move(with_slot));
        } else {
          auto slot = seg.free.back();
          seg.free.pop_back();
          with_slot(slot);
        }
        return rp;
      },
      [segments](fetch_release_atom, const std::string& name, std::uint32_t slot) {
        if (auto it = segments->find(name); it != segments->end())
          it->second.give_back(slot);
      },
    };
  });
}

namespace {

/// What a fetching store keeps (on its own thread only).
struct fetching_state {
  runtime::store_port store;
  caf::actor registry;
  std::string name;
  std::uint64_t slot_bytes = 0;
  std::uint32_t slots = 0;
  std::shared_ptr<fetch_counters> counters;
  /// The fetcher joined and its segment mapped here (memory null: gets go to the store).
  caf::actor fetcher;
  std::string segment;
  std::shared_ptr<shm_mapping> memory;
  /// Joins started, so that a late answer from an older fetcher is ignored.
  std::uint64_t joins = 0;
  /// Gets sent to the current fetcher and not answered yet, by number. When the fetcher
  /// changes or goes, the store answers them: a fetcher whose process died may never answer
  /// (its death does not always reach this process, whose messages to it go through the
  /// control process), and its replacement does not know them.
  std::map<std::uint64_t, std::pair<runtime::store_get,
                                    caf::typed_response_promise<runtime::store_object>>>
    waiting;
  std::uint64_t next_get = 0;
};

} // namespace

runtime::store_port spawn_fetching_store(caf::actor_system& sys, runtime::store_port store,
                                         caf::actor registry, std::string name,
                                         std::uint64_t slot_bytes, std::uint32_t slots,
                                         std::shared_ptr<fetch_counters> counters) {
  auto st = std::make_shared<fetching_state>();
  st->store = std::move(store);
  st->registry = std::move(registry);
  st->name = std::move(name);
  st->slot_bytes = slot_bytes;
  st->slots = std::max<std::uint32_t>(1, slots);
  st->counters = counters ? std::move(counters) : std::make_shared<fetch_counters>();
  auto h = sys.spawn([st](caf::event_based_actor* self) -> caf::behavior {
    self->send(st->registry, caf::join_atom::value, st->name, caf::actor_cast<caf::actor>(self));
    // The store port it wraps ends with it.
    self->attach_functor([st] { caf::anon_send_exit(st->store, caf::exit_reason::user_shutdown); });
    auto direct = [self, st](const runtime::store_get& g) {
      st->counters->direct += 1;
      return self->delegate(st->store, g);
    };
    return {
      [self, st](caf::put_atom, const std::string&, const caf::actor& fetcher) {
        for (auto& [n, w] : st->waiting) {
          st->counters->direct += 1;
          w.second.delegate(st->store, w.first);
        }
        st->waiting.clear();
        st->memory.reset();
        st->fetcher = fetcher;
        st->segment.clear();
        if (!fetcher)
          return;
        auto join = ++st->joins;
        self->request(fetcher, std::chrono::seconds(30), fetcher_join{st->slot_bytes, st->slots})
          .then(
            [st, join](const fetcher_segment& s) {
              if (join != st->joins) {
                ::shm_unlink(s.name.c_str());  // an older fetcher's: never mapped here
                return;
              }
              auto memory = shm_mapping::open(s.name, s.slot_bytes * s.slots);
              // Mapped (or not: another host's segment): the name is no longer needed.
              ::shm_unlink(s.name.c_str());
              if (!memory)
                return;  // gets go to the store
              st->memory = std::move(*memory);
              st->segment = s.name;
            },
            [](const caf::error&) {});
      },
      [self, st, direct](const runtime::store_get& g) -> caf::result<runtime::store_object> {
        if (!st->memory)
          return direct(g);
        auto rp = self->make_response_promise<runtime::store_object>();
        auto memory = st->memory;
        auto fetcher = st->fetcher;
        auto segment = st->segment;
        const auto n = ++st->next_get;
        st->waiting.emplace(n, std::make_pair(g, rp));
        self->request(fetcher, std::chrono::seconds(90), fetch_block{g.key, segment})
          .then(
            [self, st, n, memory, fetcher, segment](const fetched_block& b) {
              auto i = st->waiting.find(n);
              if (i == st->waiting.end()) {
                // Answered by the store since (the fetcher changed): only free the slot.
                self->send(fetcher, fetch_release_atom::value, segment, b.slot);
                return;
              }
              auto rp = std::move(i->second.second);
              st->waiting.erase(i);
              runtime::store_object o{b.key, b.size, {}, b.checksum};
              const auto* from = memory->data() + b.slot * st->slot_bytes;
              o.payload.assign(from, from + b.size);
              // Copied out: the fetcher may fill the slot again.
              self->send(fetcher, fetch_release_atom::value, segment, b.slot);
              st->counters->fetched += 1;
              st->counters->bytes += b.size;
              rp.deliver(std::move(o));
            },
            [st, n](caf::error& e) {
              auto i = st->waiting.find(n);
              if (i == st->waiting.end())
                return;
              auto [g, rp] = std::move(i->second);
              st->waiting.erase(i);
              if (runtime::is(e, runtime::errc::not_found)) {
                rp.deliver(std::move(e));
                return;
              }
              // The fetcher failed (or died): the store itself answers.
              st->counters->direct += 1;
              rp.delegate(st->store, g);
            });
        return rp;
      },
      [self, st](runtime::store_put& p) { return self->delegate(st->store, std::move(p)); },
      [self, st](const runtime::store_has& x) { return self->delegate(st->store, x); },
      [self, st](const runtime::store_delete& x) { return self->delegate(st->store, x); },
      [self, st](const runtime::store_list& x) { return self->delegate(st->store, x); },
      [self, st](runtime::store_stats_atom x) { return self->delegate(st->store, x); },
    };
  });
  return caf::actor_cast<runtime::store_port>(h);
}

} // namespace troupe::cluster

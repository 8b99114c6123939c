#include "cluster/device_engines.hpp"

#include <map>
#include <mutex>

namespace troupe::cluster {

namespace {

struct registry {
  std::mutex mutex;
  std::map<std::string, device_engine, std::less<>> engines;
};

registry& engines() {
  static registry r;
  return r;
}

} // namespace

void add_device_engine(std::string name, device_engine engine) {
  auto& r = engines();
  std::lock_guard lock(r.mutex);
  r.engines.insert_or_assign(std::move(name), std::move(engine));
}

void remove_device_engine(std::string_view name) {
  auto& r = engines();
  std::lock_guard lock(r.mutex);
  if (auto i = r.engines.find(name); i != r.engines.end())
    r.engines.erase(i);
}

const device_engine* find_device_engine(std::string_view name) {
  auto& r = engines();
  std::lock_guard lock(r.mutex);
  auto i = r.engines.find(name);
  return i == r.engines.end() ? nullptr : &i->second;
}

} // namespace troupe::cluster

#include "runtime/log.hpp"

#include <caf/actor_clock.hpp>

#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <atomic>
#include <ctime>
#include <utility>
#include <mutex>

namespace troupe::runtime::log {

namespace {

thread_local clock_setting current_clock;

std::string wall_stamp() {
  using namespace std::chrono;
  auto now = system_clock::now();
  auto secs = system_clock::to_time_t(now);
  auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  auto n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03dZ", static_cast<int>(ms));
  return buf;
}

class clock_flag final : public spdlog::custom_flag_formatter {
public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    auto stamp = now_stamp();
    dest.append(stamp.data(), stamp.data() + stamp.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<clock_flag>();
  }
};

std::atomic<spdlog::level::level_enum> current_level{spdlog::level::info};
std::mutex registry_mtx;

} // namespace

std::string now_stamp() {
  const auto& s = current_clock;
  if (s.clock == nullptr || !s.is_virtual)
    return wall_stamp();
  auto t = to_seconds(s.clock->now() - s.origin);
  char buf[48];
  std::snprintf(buf, sizeof(buf), "t=%.6fs", t);
  return buf;
}

clock_setting set_clock(clock_setting setting) {
  return std::exchange(current_clock, setting);
}

std::shared_ptr<spdlog::logger> get(std::string_view component) {
  std::lock_guard guard{registry_mtx};
  std::string name{component};
  if (auto existing = spdlog::get(name))
    return existing;
  auto logger = std::make_shared<spdlog::logger>(
    name, std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<clock_flag>('*').set_pattern("[%*] [%^%l%$] [%n] %v");
  logger->set_formatter(std::move(formatter));
  logger->set_level(current_level.load());
  spdlog::register_logger(logger);
  return logger;
}

bool set_level(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string{level});
  if (lvl == spdlog::level::off && level != "off")
    return false;
  current_level = lvl;
  spdlog::apply_all([lvl](const std::shared_ptr<spdlog::logger>& l) { l->set_level(lvl); });
  return true;
}

} // namespace troupe::runtime::log

// server_fixture: an entrypoint on 127.0.0.1 (ephemeral port) over the scripted fake service.
#pragma once

#include "actors/entrypoint/entrypoint.hpp"
#include "fake_service.hpp"
#include "http_client.hpp"
#include "runtime/world.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace troupe::test {

inline constexpr const char* test_model = "DeepSeek-V4-Flash";
inline constexpr const char* reply_text = "Hello! I am a scripted reply from the fake service.";

class server_fixture {
public:
  /// `tweak` adjusts the parameters before the server starts.
  explicit server_fixture(std::function<void(actors::entrypoint_params&)> tweak = {})
    : world_(runtime::world_options{runtime::world_mode::real, 1, 2, false, {}}),
      log_(std::make_shared<fake_log>()),
      script_(std::make_shared<script_slot>()) {
    script_->script.tokens = text_tokens(shipped_codec(), reply_text);
    auto slot = script_;
    service_ = spawn_fake_service(
      world_.system(),
      [slot](const actors::generation_request&) {
        std::lock_guard g{slot->mtx};
        return slot->script;
      },
      log_);
    actors::entrypoint_params p;
    p.address = "127.0.0.1";
    p.port = 0;
    p.models = {test_model};
    p.codec = &shipped_codec();
    p.service = service_;
    p.metrics = &registry_;
    p.max_body_bytes = 1u << 20;
    p.max_context_tokens = 4096;
    p.read_timeout = std::chrono::milliseconds(3000);
    p.write_timeout = std::chrono::milliseconds(3000);
    p.service_timeout = std::chrono::milliseconds(3000);
    p.cancel_timeout = std::chrono::milliseconds(1000);
    if (tweak)
      tweak(p);
    server_ = std::make_unique<actors::entrypoint>(world_.system(), p);
    auto port = server_->start();
    REQUIRE_MESSAGE(port, "entrypoint did not start");
    port_ = *port;
  }

  ~server_fixture() {
    server_->stop(std::chrono::milliseconds(0));
    server_.reset();
  }

  std::uint16_t port() const { return port_; }
  actors::entrypoint& server() { return *server_; }
  fake_log& log() { return *log_; }
  runtime::registry& registry() { return registry_; }

  void set_script(fake_script s) {
    std::lock_guard g{script_->mtx};
    script_->script = std::move(s);
  }

  /// Waits (bounded) until `pred` holds; returns whether it did.
  template <class Pred>
  static bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred())
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return pred();
  }

  /// The value of a sample line `name` (with labels as written) in /metrics; -1 when absent.
  double metric(const std::string& sample) {
    const std::string text = registry_.expose();
    const std::string key = sample + " ";
    auto pos = text.find("\n" + key);
    if (pos == std::string::npos)
      return -1;
    pos += 1 + key.size();
    return std::stod(text.substr(pos, text.find('\n', pos) - pos));
  }

  std::optional<http_reply> post(const std::string& target, const std::string& body,
                                 const std::map<std::string, std::string>& headers = {}) {
    return http_call(port_, "POST", target, body, headers);
  }

private:
  struct script_slot {
    std::mutex mtx;
    fake_script script;
  };
  runtime::world world_;
  std::shared_ptr<fake_log> log_;
  std::shared_ptr<script_slot> script_;
  runtime::registry registry_;
  actors::generation_service service_;
  std::unique_ptr<actors::entrypoint> server_;
  std::uint16_t port_ = 0;
};

/// A Chat Completions body asking `content`, with extra fields merged in.
inline std::string chat_body(const nlohmann::json& extra = nlohmann::json::object(),
                             const std::string& content = "Say hello.") {
  nlohmann::json j = {{"model", test_model},
                      {"messages", {{{"role", "user"}, {"content", content}}}}};
  j.update(extra);
  return j.dump();
}

inline std::string responses_body(const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j = {{"model", test_model}, {"input", "Say hello."}};
  j.update(extra);
  return j.dump();
}

inline std::string messages_body(const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j = {{"model", test_model},
                      {"max_tokens", 256},
                      {"messages", {{{"role", "user"}, {"content", "Say hello."}}}}};
  j.update(extra);
  return j.dump();
}

inline nlohmann::json weather_tool_openai() {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"description", "Weather forecast"},
            {"parameters",
             {{"type", "object"},
              {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
              {"required", {"city", "days"}}}}}}};
}

} // namespace troupe::test

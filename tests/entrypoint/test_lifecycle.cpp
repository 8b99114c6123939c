// Requests that end early or badly, admission, graceful stop, start errors and the API keys
// file: a client that leaves cancels its request, nothing stays in flight, a full server says
// 429 with Retry-After, stop(grace) lets streams finish and then refuses.
#include "actors/entrypoint/api_keys.hpp"
#include "server_fixture.hpp"

#include <filesystem>
#include <fstream>
#include <future>

using namespace troupe;
using namespace troupe::test;
using json = nlohmann::json;

namespace {

/// A reply of `words` words, one token every `delay`.
fake_script slow_script(int words, std::chrono::milliseconds delay) {
  std::string text;
  for (int i = 0; i < words; ++i)
    text += "word" + std::to_string(i) + " ";
  fake_script s;
  s.tokens = text_tokens(shipped_codec(), text);
  s.delay = delay;
  return s;
}

std::string stream_request(const std::string& body) {
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         "Content-Length: "
         + std::to_string(body.size()) + "\r\n\r\n" + body;
}

/// How the number `n` of a "word<n>" appears in a chunk's delta (the tokenizer splits it off).
std::string chat_piece(const std::string& n) {
  return "\"content\":\"" + n + "\"";
}

bool all_released(server_fixture& f) {
  return server_fixture::eventually([&] {
    return f.server().in_flight() == 0 && f.log().active_count() == 0
           && f.metric("troupe_http_requests_in_flight") == 0
           && f.metric("troupe_http_requests_queued") == 0;
  });
}

} // namespace

TEST_CASE("a client that disconnects mid-stream cancels its request and frees its slot") {
  server_fixture f;
  f.set_script(slow_script(400, std::chrono::milliseconds(10)));
  http_client c(f.port());
  REQUIRE(c.connect());
  REQUIRE(c.send_raw(stream_request(chat_body({{"stream", true}}))));
  const std::string got = c.read_until(chat_piece("3"));
  CHECK(got.find("text/event-stream") != std::string::npos);
  CHECK(f.server().in_flight() == 1);
  c.close();
  CHECK(server_fixture::eventually([&] { return f.log().cancel_count() == 1; }));
  CHECK(all_released(f));
  CHECK(f.metric(R"(troupe_http_cancellations_total{reason="client_disconnect"})") == 1);
  CHECK(f.metric(R"(troupe_http_requests_total{route="/v1/chat/completions",status="499"})") == 1);
  CHECK(f.metric("troupe_http_connections_open") == 0);
}

TEST_CASE("a client that disconnects while waiting for a whole response cancels it too") {
  server_fixture f;
  f.set_script(slow_script(400, std::chrono::milliseconds(10)));
  http_client c(f.port());
  REQUIRE(c.connect());
  REQUIRE(c.send_raw(stream_request(chat_body())));
  CHECK(server_fixture::eventually([&] { return f.log().request_count() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c.close();
  CHECK(server_fixture::eventually([&] { return f.log().cancel_count() == 1; }));
  CHECK(all_released(f));
}

TEST_CASE("a request whose actor ignores the cancel is given up after cancel_timeout") {
  server_fixture f;
  auto s = slow_script(100, std::chrono::milliseconds(8));  // ~1.6 s, past the give-up
  s.ignore_cancel = true;
  f.set_script(s);
  http_client c(f.port());
  REQUIRE(c.connect());
  REQUIRE(c.send_raw(stream_request(chat_body({{"stream", true}}))));
  c.read_until(chat_piece("2"));
  c.close();
  CHECK(server_fixture::eventually([&] { return f.log().cancel_count() == 1; }));
  // The slot comes back after the fixture's 1 s cancel_timeout, though the fake still runs.
  CHECK(server_fixture::eventually([&] { return f.server().in_flight() == 0; },
                                   std::chrono::seconds(4)));
}

TEST_CASE("a full server answers 429 with Retry-After in the API's shape") {
  server_fixture f([](actors::entrypoint_params& p) {
    p.max_in_flight = 1;
    p.retry_after = std::chrono::seconds(7);
  });
  f.set_script(slow_script(60, std::chrono::milliseconds(10)));
  http_client busy(f.port());
  REQUIRE(busy.connect());
  REQUIRE(busy.send_raw(stream_request(chat_body({{"stream", true}}))));
  busy.read_until(chat_piece("1"));

  auto r = f.post("/v1/chat/completions", chat_body());
  REQUIRE(r);
  CHECK(r->status == 429);
  CHECK(r->header("retry-after") == "7");
  CHECK(json::parse(r->body)["error"]["code"] == "rate_limit_exceeded");
  auto m = f.post("/v1/messages", messages_body());
  REQUIRE(m);
  CHECK(m->status == 429);
  CHECK(json::parse(m->body)["error"]["type"] == "rate_limit_error");

  // The first stream completes.
  CHECK(busy.read_until("data: [DONE]").find("data: [DONE]") != std::string::npos);
  CHECK(all_released(f));
  f.set_script(slow_script(3, std::chrono::milliseconds(1)));
  auto again = f.post("/v1/chat/completions", chat_body());
  REQUIRE(again);
  CHECK(again->status == 200);
}

TEST_CASE("stop(grace) lets a stream in flight finish, closes idle connections, then refuses") {
  server_fixture f;
  f.set_script(slow_script(60, std::chrono::milliseconds(10)));
  http_client idle(f.port());
  REQUIRE(idle.connect());
  http_client c(f.port());
  REQUIRE(c.connect());
  REQUIRE(c.send_raw(stream_request(chat_body({{"stream", true}}))));
  c.read_until(chat_piece("1"));

  auto stopping = std::async(std::launch::async,
                             [&] { f.server().stop(std::chrono::seconds(10)); });
  CHECK(idle.closed_by_server(std::chrono::seconds(3)));
  CHECK_FALSE(f.server().ready());
  const std::string rest = c.read_until("data: [DONE]");
  CHECK(rest.find("data: [DONE]") != std::string::npos);
  CHECK(rest.find(chat_piece("59")) != std::string::npos);
  CHECK(stopping.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(f.log().cancel_count() == 0);

  http_client late(f.port());
  CHECK_FALSE(late.connect(std::chrono::seconds(2)));
}

TEST_CASE("stop(grace) cancels what is still running after the grace with an error event") {
  server_fixture f;
  f.set_script(slow_script(3000, std::chrono::milliseconds(5)));
  http_client m(f.port());
  REQUIRE(m.connect());
  const std::string body = messages_body({{"stream", true}});
  REQUIRE(m.send_raw("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: "
                     + std::to_string(body.size()) + "\r\n\r\n" + body));
  m.read_until(R"("text":"2")");
  const auto start = std::chrono::steady_clock::now();
  f.server().stop(std::chrono::milliseconds(200));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  const std::string rest = m.read_until("event: error");
  CHECK(rest.find("event: error") != std::string::npos);
  CHECK(rest.find("overloaded_error") != std::string::npos);
  CHECK(m.closed_by_server(std::chrono::seconds(3)));
  CHECK(f.log().cancel_count() == 1);
  CHECK(f.server().in_flight() == 0);
}

TEST_CASE("a refused request is answered 503 with Retry-After") {
  server_fixture f;
  fake_script s;
  s.refuse = true;
  f.set_script(s);
  auto r = f.post("/v1/chat/completions", chat_body());
  REQUIRE(r);
  CHECK(r->status == 503);
  CHECK(!r->header("retry-after").empty());
  CHECK(json::parse(r->body)["error"]["message"].get<std::string>().find("refused")
        != std::string::npos);
  auto st = f.post("/v1/chat/completions", chat_body({{"stream", true}}));
  REQUIRE(st);
  CHECK(st->status == 503);
  CHECK(all_released(f));
}

TEST_CASE("a generation error is a 500, or an error event once the stream has started") {
  server_fixture f;
  auto s = slow_script(20, std::chrono::milliseconds(1));
  s.fail_after = 5;
  f.set_script(s);
  auto r = f.post("/v1/chat/completions", chat_body());
  REQUIRE(r);
  CHECK(r->status == 500);
  auto e = json::parse(r->body)["error"];
  CHECK(e["type"] == "server_error");
  CHECK(e["message"] == "scripted failure");

  auto st = f.post("/v1/chat/completions", chat_body({{"stream", true}}));
  REQUIRE(st);
  CHECK(st->status == 200);
  auto events = parse_sse(st->body);
  REQUIRE(!events.empty());
  CHECK(json::parse(events.back().data)["error"]["message"] == "scripted failure");

  auto rs = f.post("/v1/responses", responses_body({{"stream", true}}));
  REQUIRE(rs);
  auto revents = parse_sse(rs->body);
  REQUIRE(!revents.empty());
  CHECK(revents.back().event == "error");

  auto m = f.post("/v1/messages", messages_body());
  REQUIRE(m);
  CHECK(m->status == 500);
  CHECK(json::parse(m->body)["error"]["type"] == "api_error");
  CHECK(all_released(f));
}

TEST_CASE("a request actor that exits without its end is reported as a server error") {
  server_fixture f;
  auto s = slow_script(20, std::chrono::milliseconds(1));
  s.exit_after = 4;
  f.set_script(s);
  auto r = f.post("/v1/chat/completions", chat_body());
  REQUIRE(r);
  CHECK(r->status == 500);
  CHECK(all_released(f));
}

TEST_CASE("start reports a port in use and missing parts as errors") {
  server_fixture f;
  runtime::world w(runtime::world_options{runtime::world_mode::real, 1, 1, false, {}});
  actors::entrypoint_params p;
  p.codec = &shipped_codec();
  SUBCASE("no service") {
    actors::entrypoint e(w.system(), p);
    auto r = e.start();
    REQUIRE_FALSE(r);
    CHECK(w.system().render(r.error()).find("no generation service") != std::string::npos);
  }
  SUBCASE("the port is taken") {
    p.service = spawn_fake_service(
      w.system(), [](const actors::generation_request&) { return fake_script{}; },
      std::make_shared<fake_log>());
    p.port = f.port();
    actors::entrypoint e(w.system(), p);
    auto r = e.start();
    REQUIRE_FALSE(r);
    CHECK(w.system().render(r.error()).find("cannot listen on 127.0.0.1:") != std::string::npos);
  }
  SUBCASE("a bad address") {
    p.service = spawn_fake_service(
      w.system(), [](const actors::generation_request&) { return fake_script{}; },
      std::make_shared<fake_log>());
    p.address = "not-an-ip";
    actors::entrypoint e(w.system(), p);
    REQUIRE_FALSE(e.start());
  }
}

TEST_CASE("an API keys file is read line by line with comments") {
  const auto dir = std::filesystem::temp_directory_path() / "troupe_test_api_keys";
  std::filesystem::create_directories(dir);
  const auto file = dir / "keys.txt";
  {
    std::ofstream out(file);
    out << "# keys for the team\n\n  sk-one  \nsk-two\r\n   # indented comment\nsk-one\n";
  }
  auto keys = actors::load_api_keys(file);
  REQUIRE(std::holds_alternative<std::set<std::string>>(keys));
  CHECK(std::get<std::set<std::string>>(keys) == std::set<std::string>{"sk-one", "sk-two"});
  CHECK(actors::api_key_matches({"sk-one", "sk-two"}, "sk-two"));
  CHECK_FALSE(actors::api_key_matches({"sk-one", "sk-two"}, "sk-tw"));
  CHECK_FALSE(actors::api_key_matches({}, ""));

  auto missing = actors::load_api_keys(dir / "nope.txt");
  REQUIRE(std::holds_alternative<actors::api_keys_error>(missing));
  CHECK(std::get<actors::api_keys_error>(missing).message.find("nope.txt: no such file")
        != std::string::npos);
  auto directory = actors::load_api_keys(dir);
  REQUIRE(std::holds_alternative<actors::api_keys_error>(directory));
  CHECK(std::get<actors::api_keys_error>(directory).message.find("not a regular file")
        != std::string::npos);
  {
    std::ofstream out(file);
    out << "sk-ok\nsk bad\n";
  }
  auto bad = actors::load_api_keys(file);
  REQUIRE(std::holds_alternative<actors::api_keys_error>(bad));
  CHECK(std::get<actors::api_keys_error>(bad).message.find("keys.txt:2:") != std::string::npos);
  std::filesystem::remove_all(dir);
}

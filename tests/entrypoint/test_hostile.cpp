// Malformed and hostile requests: each gets its status in the API's own error shape (or a
// close, where no response can be framed), and the server answers a valid request afterwards
// with nothing left in flight.
#include "server_fixture.hpp"

using namespace troupe;
using namespace troupe::test;
using json = nlohmann::json;
using namespace std::string_literals;

namespace {

constexpr const char* key = "sk-test-key";
const std::map<std::string, std::string> bearer = {{"Authorization", "Bearer sk-test-key"}};

void tweak(actors::entrypoint_params& p) {
  p.api_keys = {key, "sk-second"};
  p.read_timeout = std::chrono::milliseconds(400);
  p.max_body_bytes = 64u << 10;
  p.max_header_bytes = 4u << 10;
  p.max_context_tokens = 512;
}

// OpenAI's {"error": {"message", "type", "param", "code"}}.
json openai_error(const std::optional<http_reply>& r, int status) {
  REQUIRE(r);
  CHECK(r->status == status);
  CHECK(r->header("content-type").find("application/json") == 0);
  auto j = json::parse(r->body);
  REQUIRE(j.contains("error"));
  CHECK(j["error"]["message"].is_string());
  CHECK(!j["error"]["message"].get<std::string>().empty());
  CHECK(j["error"]["type"].is_string());
  CHECK(j["error"].contains("param"));
  CHECK(j["error"].contains("code"));
  return j["error"];
}

// Anthropic's {"type": "error", "error": {"type", "message"}}.
json anthropic_error(const std::optional<http_reply>& r, int status) {
  REQUIRE(r);
  CHECK(r->status == status);
  auto j = json::parse(r->body);
  CHECK(j["type"] == "error");
  CHECK(j["error"]["type"].is_string());
  CHECK(j["error"]["message"].is_string());
  return j["error"];
}

std::optional<http_reply> raw(server_fixture& f, const std::string& bytes) {
  http_client c(f.port());
  if (!c.connect() || !c.send_raw(bytes))
    return std::nullopt;
  return c.read_reply();
}

std::string post_head(const std::string& target, const std::string& extra) {
  return "POST " + target + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key + "\r\n"
         + extra;
}

} // namespace

TEST_CASE("hostile requests get their status and error shape and the server keeps serving") {
  server_fixture f(tweak);

  SUBCASE("invalid JSON on chat completions: 400, OpenAI shape") {
    auto e = openai_error(f.post("/v1/chat/completions", "{\"model\": ", bearer), 400);
    CHECK(e["type"] == "invalid_request_error");
  }
  SUBCASE("invalid JSON on messages: 400, Anthropic shape") {
    auto e = anthropic_error(f.post("/v1/messages", "{nope", bearer), 400);
    CHECK(e["type"] == "invalid_request_error");
  }
  SUBCASE("messages of the wrong type: 400 naming the parameter") {
    auto e = openai_error(f.post("/v1/chat/completions",
                                 json{{"model", test_model}, {"messages", "hi"}}.dump(), bearer),
                          400);
    CHECK(e["param"] == "messages");
  }
  SUBCASE("missing messages: 400") {
    openai_error(f.post("/v1/chat/completions", json{{"model", test_model}}.dump(), bearer), 400);
  }
  SUBCASE("a body that is a JSON array: 400") {
    openai_error(f.post("/v1/chat/completions", "[1, 2, 3]", bearer), 400);
  }
  SUBCASE("an empty body: 400") {
    openai_error(f.post("/v1/responses", "", bearer), 400);
  }
  SUBCASE("temperature of the wrong type: 400") {
    auto e = openai_error(f.post("/v1/chat/completions", chat_body({{"temperature", "hot"}}),
                                 bearer),
                          400);
    CHECK(e["param"] == "temperature");
  }
  SUBCASE("a negative max_tokens: 400") {
    openai_error(f.post("/v1/chat/completions", chat_body({{"max_tokens", -5}}), bearer), 400);
  }
  SUBCASE("invalid UTF-8 in a string: 400") {
    std::string body = std::string(R"({"model": "DeepSeek-V4-Flash", "messages": [{"role": )")
                       + "\"user\", \"content\": \"caf\xC3\x28 \xFF\xFE\"}]}";
    openai_error(f.post("/v1/chat/completions", body, bearer), 400);
  }
  SUBCASE("JSON nested 1000 levels deep: 400") {
    std::string deep = std::string(1000, '[') + std::string(1000, ']');
    std::string body = R"({"model": "DeepSeek-V4-Flash", "messages": )" + deep + "}";
    openai_error(f.post("/v1/chat/completions", body, bearer), 400);
  }
  SUBCASE("a Responses input of the wrong type: 400") {
    openai_error(f.post("/v1/responses", responses_body({{"input", 42}}), bearer), 400);
  }
  SUBCASE("n = 2: 400 naming n") {
    auto e = openai_error(f.post("/v1/chat/completions", chat_body({{"n", 2}}), bearer), 400);
    CHECK(e["param"] == "n");
  }
  SUBCASE("a prompt longer than the context: 400 naming the limit") {
    std::string long_text;
    for (int i = 0; i < 400; ++i)
      long_text += "word" + std::to_string(i) + " ";
    auto e = openai_error(
      f.post("/v1/chat/completions", chat_body(json::object(), long_text), bearer), 400);
    CHECK(e["message"].get<std::string>().find("512") != std::string::npos);
    CHECK(e["code"] == "context_length_exceeded");
  }
  SUBCASE("a body over the limit (Content-Length): 413 before the body is read") {
    http_client c(f.port());
    REQUIRE(c.connect());
    REQUIRE(c.send_raw(post_head("/v1/chat/completions", "Content-Length: 10000000\r\n\r\n")
                       + std::string(1000, 'x')));
    auto e = openai_error(c.read_reply(), 413);
    CHECK(e["message"].get<std::string>().find("65536") != std::string::npos);
  }
  SUBCASE("a chunked body over the limit: 413, Anthropic shape on messages") {
    http_client c(f.port());
    REQUIRE(c.connect());
    std::string chunks;
    for (int i = 0; i < 20; ++i)
      chunks += "1000\r\n" + std::string(0x1000, 'a') + "\r\n";
    REQUIRE(c.send_raw(post_head("/v1/messages", "Transfer-Encoding: chunked\r\n\r\n") + chunks));
    auto e = anthropic_error(c.read_reply(), 413);
    CHECK(e["type"] == "request_too_large");
  }
  SUBCASE("no API key: 401 in each API's shape") {
    auto e = openai_error(f.post("/v1/chat/completions", chat_body()), 401);
    CHECK(e["code"] == "invalid_api_key");
    auto a = anthropic_error(f.post("/v1/messages", messages_body()), 401);
    CHECK(a["type"] == "authentication_error");
    openai_error(http_call(f.port(), "GET", "/v1/models"), 401);
  }
  SUBCASE("a wrong API key: 401") {
    openai_error(f.post("/v1/chat/completions", chat_body(),
                        {{"Authorization", "Bearer sk-test-keyX"}}),
                 401);
    anthropic_error(f.post("/v1/messages", messages_body(), {{"x-api-key", "sk-test"}}), 401);
    openai_error(f.post("/v1/chat/completions", chat_body(), {{"Authorization", "Basic abc"}}),
                 401);
  }
  SUBCASE("either key header is accepted on every API route") {
    auto a = f.post("/v1/chat/completions", chat_body(), {{"x-api-key", "sk-second"}});
    REQUIRE(a);
    CHECK(a->status == 200);
    auto b = f.post("/v1/messages", messages_body(), {{"Authorization", "bearer sk-second"}});
    REQUIRE(b);
    CHECK(b->status == 200);
  }
  SUBCASE("an unknown model: 404 model_not_found in each API's shape") {
    auto e = openai_error(
      f.post("/v1/chat/completions", chat_body({{"model", "gpt-nonexistent"}}), bearer), 404);
    CHECK(e["code"] == "model_not_found");
    auto a = anthropic_error(
      f.post("/v1/messages", messages_body({{"model", "claude-nope"}}), bearer), 404);
    CHECK(a["type"] == "not_found_error");
    openai_error(http_call(f.port(), "GET", "/v1/models/nope", {}, bearer), 404);
  }
  SUBCASE("a wrong method: 405 with Allow") {
    auto r = http_call(f.port(), "GET", "/v1/chat/completions", {}, bearer);
    openai_error(r, 405);
    CHECK(r->header("allow") == "POST");
    auto d = http_call(f.port(), "DELETE", "/health");
    openai_error(d, 405);
    CHECK(d->header("allow") == "GET");
  }
  SUBCASE("an unknown route: 404") {
    auto e = openai_error(http_call(f.port(), "GET", "/v2/everything?x=1"), 404);
    CHECK(e["code"] == "unknown_route");
    openai_error(f.post("/v1/chat/completions/extra", chat_body(), bearer), 404);
  }
  SUBCASE("a garbage request line: 400") {
    openai_error(raw(f, "HELLO THERE\r\n\r\n"), 400);
  }
  SUBCASE("a header line without a colon: 400") {
    openai_error(raw(f, "GET /health HTTP/1.1\r\nHost: x\r\nthis is not a header\r\n\r\n"), 400);
  }
  SUBCASE("a NUL byte in a header value: 400") {
    openai_error(raw(f, "GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n"s), 400);
  }
  SUBCASE("two different Content-Length headers (smuggling): 400") {
    openai_error(raw(f, post_head("/v1/chat/completions",
                                  "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!")),
                 400);
  }
  SUBCASE("two equal Content-Length headers: 400") {
    openai_error(raw(f, post_head("/v1/chat/completions",
                                  "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}")),
                 400);
  }
  SUBCASE("Transfer-Encoding chunked with a Content-Length (smuggling): 400") {
    openai_error(raw(f, post_head("/v1/chat/completions",
                                  "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  "0\r\n\r\n")),
                 400);
  }
  SUBCASE("a Transfer-Encoding that is not chunked: 400") {
    openai_error(raw(f, post_head("/v1/chat/completions", "Transfer-Encoding: gzip\r\n\r\nxx")),
                 400);
  }
  SUBCASE("a negative Content-Length: 400") {
    openai_error(raw(f, post_head("/v1/chat/completions", "Content-Length: -1\r\n\r\n")), 400);
  }
  SUBCASE("an invalid chunk size: 400") {
    openai_error(raw(f, post_head("/v1/chat/completions",
                                  "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n")),
                 400);
  }
  SUBCASE("header fields over the limit: 431") {
    openai_error(raw(f, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(8000, 'b')
                          + "\r\n\r\n"),
                 431);
  }
  SUBCASE("a slowloris half request: 408 after the read timeout, then closed") {
    http_client c(f.port());
    REQUIRE(c.connect());
    REQUIRE(c.send_raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"));
    const auto start = std::chrono::steady_clock::now();
    auto e = openai_error(c.read_reply(std::chrono::seconds(5)), 408);
    CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(300));
    CHECK(c.closed_by_server(std::chrono::seconds(3)));
  }
  SUBCASE("a body that never completes: 408") {
    http_client c(f.port());
    REQUIRE(c.connect());
    REQUIRE(c.send_raw(post_head("/v1/messages", "Content-Length: 100\r\n\r\n{\"model\"")));
    anthropic_error(c.read_reply(std::chrono::seconds(5)), 408);
  }
  SUBCASE("a connection that sends nothing is closed without a response") {
    http_client c(f.port());
    REQUIRE(c.connect());
    CHECK(c.closed_by_server(std::chrono::seconds(3)));
  }
  SUBCASE("binary garbage gets a 400 or a close, never a crash") {
    std::string junk;
    std::uint32_t x = 12345;
    for (int i = 0; i < 3000; ++i) {
      x = x * 1664525u + 1013904223u;
      junk += static_cast<char>(x >> 24);
    }
    http_client c(f.port());
    REQUIRE(c.connect());
    c.send_raw(junk);
    auto r = c.read_reply(std::chrono::seconds(3));
    if (r)
      CHECK(r->status == 400);
  }
  SUBCASE("a client that disconnects in the middle of a request line is forgotten") {
    http_client c(f.port());
    REQUIRE(c.connect());
    REQUIRE(c.send_raw("POST /v1/chat/comp"));
    c.close();
  }

  // Whatever came before, a valid request is answered and nothing is left in flight.
  auto ok = f.post("/v1/chat/completions", chat_body(), bearer);
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(json::parse(ok->body)["choices"][0]["message"]["content"] == reply_text);
  CHECK(server_fixture::eventually([&] { return f.server().in_flight() == 0; }));
  CHECK(server_fixture::eventually([&] { return f.log().active_count() == 0; }));
}

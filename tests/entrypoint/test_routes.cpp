// The entrypoint's routes over loopback against the scripted service: each API streaming and
// not, usage, reasoning, tool calls, stop strings, max_tokens, sampling, models, health,
// readiness and metrics.
#include "actors/entrypoint/api_response.hpp"
#include "server_fixture.hpp"

using namespace troupe;
using namespace troupe::test;
using json = nlohmann::json;

namespace {

json parse(const std::string& s) {
  return json::parse(s);
}

std::vector<json> data_objects(const std::string& body, bool* done = nullptr) {
  std::vector<json> out;
  for (const auto& e : parse_sse(body)) {
    if (e.data == "[DONE]") {
      if (done)
        *done = true;
      continue;
    }
    out.push_back(json::parse(e.data));
  }
  return out;
}

std::string chat_stream_text(const std::vector<json>& chunks, const char* field = "content") {
  std::string text;
  for (const auto& c : chunks)
    if (c.contains("choices") && !c["choices"].empty()) {
      const auto& d = c["choices"][0]["delta"];
      if (d.contains(field) && d[field].is_string())
        text += d[field].get<std::string>();
    }
  return text;
}

std::size_t reply_token_count() {
  return text_tokens(shipped_codec(), reply_text).size();
}

} // namespace

TEST_CASE("a non-streaming chat completion returns the scripted text with the service's usage") {
  server_fixture f;
  auto r = f.post("/v1/chat/completions", chat_body());
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("content-type").find("application/json") == 0);
  auto j = parse(r->body);
  CHECK(j["object"] == "chat.completion");
  CHECK(j["model"] == test_model);
  CHECK(j["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  CHECK(j["choices"][0]["message"]["role"] == "assistant");
  CHECK(j["choices"][0]["message"]["content"] == reply_text);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  const auto req = f.log().last_request();
  REQUIRE(req);
  CHECK(j["usage"]["prompt_tokens"] == req->prompt.size());
  CHECK(j["usage"]["completion_tokens"] == reply_token_count());
  CHECK(j["usage"]["total_tokens"] == req->prompt.size() + reply_token_count());
  CHECK(req->stop_ids == std::vector<std::int32_t>{
                           static_cast<std::int32_t>(shipped_codec().stop_ids()[0])});
}

TEST_CASE("a streaming chat completion sends chunks, the finish with usage, then [DONE]") {
  server_fixture f;
  auto r = f.post("/v1/chat/completions",
                  chat_body({{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("content-type").find("text/event-stream") == 0);
  bool done = false;
  auto chunks = data_objects(r->body, &done);
  CHECK(done);
  REQUIRE(chunks.size() >= 3);
  CHECK(chunks.front()["object"] == "chat.completion.chunk");
  CHECK(chunks.front()["choices"][0]["delta"]["role"] == "assistant");
  CHECK(chat_stream_text(chunks) == reply_text);
  const auto& last = chunks.back();
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  CHECK(last["usage"]["completion_tokens"] == reply_token_count());
  CHECK(last["usage"]["prompt_tokens"] == f.log().last_request()->prompt.size());
  // With include_usage the other chunks carry "usage": null.
  CHECK(chunks[1].contains("usage"));
  CHECK(chunks[1]["usage"].is_null());
  // Every SSE event of Chat Completions is a bare data line.
  for (const auto& e : parse_sse(r->body))
    CHECK(e.event.empty());
}

TEST_CASE("a non-streaming Responses request returns a completed response object") {
  server_fixture f;
  auto r = f.post("/v1/responses", responses_body({{"max_output_tokens", 100}}));
  REQUIRE(r);
  CHECK(r->status == 200);
  auto j = parse(r->body);
  CHECK(j["object"] == "response");
  CHECK(j["status"] == "completed");
  CHECK(j["id"].get<std::string>().rfind("resp_", 0) == 0);
  REQUIRE(j["output"].size() == 1);
  CHECK(j["output"][0]["type"] == "message");
  CHECK(j["output"][0]["content"][0]["text"] == reply_text);
  CHECK(j["usage"]["output_tokens"] == reply_token_count());
  CHECK(j["usage"]["input_tokens"] == f.log().last_request()->prompt.size());
  CHECK(f.log().last_request()->max_tokens == 100);
}

TEST_CASE("a streaming Responses request sends named events from created to completed") {
  server_fixture f;
  auto r = f.post("/v1/responses", responses_body({{"stream", true}}));
  REQUIRE(r);
  CHECK(r->status == 200);
  auto events = parse_sse(r->body);
  REQUIRE(events.size() >= 5);
  CHECK(events.front().event == "response.created");
  CHECK(events[1].event == "response.in_progress");
  CHECK(events.back().event == "response.completed");
  std::string text;
  for (const auto& e : events) {
    auto j = json::parse(e.data);
    CHECK(j["type"] == e.event);  // the event name is the object's type
    if (e.event == "response.output_text.delta")
      text += j["delta"].get<std::string>();
  }
  CHECK(text == reply_text);
  auto done = json::parse(events.back().data);
  CHECK(done["response"]["usage"]["output_tokens"] == reply_token_count());
}

TEST_CASE("a non-streaming Messages request returns an Anthropic message") {
  server_fixture f;
  auto r = f.post("/v1/messages", messages_body());
  REQUIRE(r);
  CHECK(r->status == 200);
  auto j = parse(r->body);
  CHECK(j["type"] == "message");
  CHECK(j["role"] == "assistant");
  CHECK(j["id"].get<std::string>().rfind("msg_", 0) == 0);
  CHECK(j["content"][0]["type"] == "text");
  CHECK(j["content"][0]["text"] == reply_text);
  CHECK(j["stop_reason"] == "end_turn");
  CHECK(j["usage"]["output_tokens"] == reply_token_count());
  CHECK(j["usage"]["input_tokens"] == f.log().last_request()->prompt.size());
  CHECK(f.log().last_request()->max_tokens == 256);
}

TEST_CASE("a streaming Messages request sends message_start to message_stop") {
  server_fixture f;
  auto r = f.post("/v1/messages", messages_body({{"stream", true}}));
  REQUIRE(r);
  CHECK(r->status == 200);
  auto events = parse_sse(r->body);
  REQUIRE(events.size() >= 5);
  CHECK(events.front().event == "message_start");
  CHECK(events.back().event == "message_stop");
  std::string text;
  bool delta_with_usage = false;
  for (const auto& e : events) {
    auto j = json::parse(e.data);
    CHECK(j["type"] == e.event);
    if (e.event == "content_block_delta" && j["delta"]["type"] == "text_delta")
      text += j["delta"]["text"].get<std::string>();
    if (e.event == "message_delta") {
      CHECK(j["delta"]["stop_reason"] == "end_turn");
      delta_with_usage = j["usage"]["output_tokens"] == reply_token_count();
    }
  }
  CHECK(text == reply_text);
  CHECK(delta_with_usage);
}

TEST_CASE("reasoning then an answer arrive as reasoning_content and content") {
  server_fixture f;
  fake_script s;
  s.tokens = reasoning_tokens(shipped_codec(), "Two and two make four.", "The answer is 4.");
  f.set_script(s);
  auto body = chat_body({{"thinking", {{"type", "enabled"}}}});
  auto r = f.post("/v1/chat/completions", body);
  REQUIRE(r);
  REQUIRE(r->status == 200);
  auto j = parse(r->body);
  CHECK(j["choices"][0]["message"]["reasoning_content"] == "Two and two make four.");
  CHECK(j["choices"][0]["message"]["content"] == "The answer is 4.");
  CHECK(j["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>() > 0);

  auto rs = f.post("/v1/chat/completions",
                   chat_body({{"thinking", {{"type", "enabled"}}}, {"stream", true}}));
  REQUIRE(rs);
  auto chunks = data_objects(rs->body);
  CHECK(chat_stream_text(chunks, "reasoning_content") == "Two and two make four.");
  CHECK(chat_stream_text(chunks) == "The answer is 4.");
}

TEST_CASE("a tool call generated over many tokens arrives as one well-formed call") {
  server_fixture f;
  const std::string city = "San Francisco, California, United States of America";
  fake_script s;
  s.tokens = tool_call_tokens(shipped_codec(), "", city);
  REQUIRE(s.tokens.size() > 30);
  f.set_script(s);
  const json tools = json::array({weather_tool_openai()});

  SUBCASE("chat completions, not streamed") {
    auto r = f.post("/v1/chat/completions", chat_body({{"tools", tools}}));
    REQUIRE(r);
    REQUIRE(r->status == 200);
    auto j = parse(r->body);
    CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
    const auto& call = j["choices"][0]["message"]["tool_calls"][0];
    CHECK(call["function"]["name"] == "get_weather");
    auto args = json::parse(call["function"]["arguments"].get<std::string>());
    CHECK(args["city"] == city);
    CHECK(args["days"] == 3);
    CHECK(call["id"].get<std::string>().rfind("call_", 0) == 0);
  }
  SUBCASE("chat completions, streamed: the arguments come in many deltas") {
    auto r = f.post("/v1/chat/completions", chat_body({{"tools", tools}, {"stream", true}}));
    REQUIRE(r);
    std::string args, name;
    int deltas = 0;
    for (const auto& c : data_objects(r->body)) {
      if (c["choices"].empty() || !c["choices"][0]["delta"].contains("tool_calls"))
        continue;
      const auto& fn = c["choices"][0]["delta"]["tool_calls"][0]["function"];
      if (fn.contains("name"))
        name += fn["name"].get<std::string>();
      if (fn.contains("arguments")) {
        args += fn["arguments"].get<std::string>();
        ++deltas;
      }
    }
    CHECK(name == "get_weather");
    CHECK(deltas > 5);
    CHECK(json::parse(args)["city"] == city);
  }
  SUBCASE("messages, streamed: input_json_delta pieces form the input") {
    json tool = {{"name", "get_weather"},
                 {"description", "Weather forecast"},
                 {"input_schema", weather_tool_openai()["function"]["parameters"]}};
    auto r = f.post("/v1/messages",
                    messages_body({{"tools", json::array({tool})}, {"stream", true}}));
    REQUIRE(r);
    std::string partial;
    std::string stop_reason;
    for (const auto& e : parse_sse(r->body)) {
      auto j = json::parse(e.data);
      if (e.event == "content_block_delta" && j["delta"]["type"] == "input_json_delta")
        partial += j["delta"]["partial_json"].get<std::string>();
      if (e.event == "message_delta")
        stop_reason = j["delta"]["stop_reason"];
    }
    CHECK(stop_reason == "tool_use");
    CHECK(json::parse(partial)["city"] == city);
  }
}

TEST_CASE("a stop string cuts the text, finishes with stop, and cancels the request") {
  server_fixture f;
  fake_script s;
  // A long reply, slow enough that the cancel lands before it ends by itself.
  s.tokens = text_tokens(shipped_codec(), "one two three four five six seven eight nine ten "
                                          "eleven twelve thirteen fourteen fifteen");
  s.delay = std::chrono::milliseconds(20);
  f.set_script(s);

  SUBCASE("not streamed") {
    auto r = f.post("/v1/chat/completions", chat_body({{"stop", {"five"}}}));
    REQUIRE(r);
    REQUIRE(r->status == 200);
    auto j = parse(r->body);
    CHECK(j["choices"][0]["message"]["content"] == "one two three four ");
    CHECK(j["choices"][0]["finish_reason"] == "stop");
  }
  SUBCASE("streamed, Messages: stop_sequence names the match") {
    auto r = f.post("/v1/messages",
                    messages_body({{"stop_sequences", {"seven"}}, {"stream", true}}));
    REQUIRE(r);
    std::string text, stop_sequence, reason;
    for (const auto& e : parse_sse(r->body)) {
      auto j = json::parse(e.data);
      if (e.event == "content_block_delta" && j["delta"]["type"] == "text_delta")
        text += j["delta"]["text"].get<std::string>();
      if (e.event == "message_delta") {
        reason = j["delta"]["stop_reason"];
        stop_sequence = j["delta"]["stop_sequence"];
      }
    }
    CHECK(text == "one two three four five six ");
    CHECK(reason == "stop_sequence");
    CHECK(stop_sequence == "seven");
  }
  CHECK(server_fixture::eventually([&] { return f.log().cancel_count() == 1; }));
  CHECK(server_fixture::eventually([&] { return f.server().in_flight() == 0; }));
}

TEST_CASE("max_tokens reaches the request and a cut output finishes with length") {
  server_fixture f;
  auto r = f.post("/v1/chat/completions", chat_body({{"max_tokens", 3}}));
  REQUIRE(r);
  REQUIRE(r->status == 200);
  auto j = parse(r->body);
  CHECK(f.log().last_request()->max_tokens == 3);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"] == 3);

  auto m = f.post("/v1/messages", messages_body({{"max_tokens", 2}}));
  REQUIRE(m);
  CHECK(json::parse(m->body)["stop_reason"] == "max_tokens");

  auto rs = f.post("/v1/responses", responses_body({{"max_output_tokens", 16}}));
  REQUIRE(rs);
  CHECK(f.log().last_request()->max_tokens == 16);
}

TEST_CASE("without max_tokens a request may use what the context leaves") {
  server_fixture f;
  auto r = f.post("/v1/chat/completions", chat_body());
  REQUIRE(r);
  const auto req = f.log().last_request();
  CHECK(req->max_tokens == 4096 - req->prompt.size());
  // A larger max_tokens is lowered to the room left.
  auto big = f.post("/v1/chat/completions", chat_body({{"max_tokens", 100000}}));
  REQUIRE(big);
  CHECK(big->status == 200);
  CHECK(f.log().last_request()->max_tokens == 4096 - req->prompt.size());
}

TEST_CASE("sampling parameters are carried into the generation request") {
  server_fixture f;
  auto r = f.post("/v1/chat/completions",
                  chat_body({{"temperature", 0.25},
                             {"top_p", 0.5},
                             {"seed", 1234},
                             {"logprobs", true},
                             {"top_logprobs", 3}}));
  REQUIRE(r);
  REQUIRE(r->status == 200);
  auto req = f.log().last_request();
  CHECK(req->sampling.temperature == doctest::Approx(0.25));
  CHECK(req->sampling.top_p == doctest::Approx(0.5));
  CHECK(req->sampling.seed == 1234);
  CHECK(req->sampling.top_logprobs == 3);

  auto m = f.post("/v1/messages", messages_body({{"top_k", 7}, {"temperature", 0.0}}));
  REQUIRE(m);
  req = f.log().last_request();
  CHECK(req->sampling.top_k == 7);
  CHECK(req->sampling.temperature == doctest::Approx(0.0));
  CHECK(req->sampling.top_logprobs == -1);

  auto plain = f.post("/v1/chat/completions", chat_body());
  REQUIRE(plain);
  req = f.log().last_request();
  CHECK(req->sampling.temperature == doctest::Approx(1.0));
  CHECK(req->sampling.top_logprobs == -1);
  CHECK(req->traffic == actors::traffic_class::chatbot);

  // A request with tools is an agent's (its KV lives by the agent TTL).
  auto tools = f.post("/v1/chat/completions",
                      chat_body({{"tools", nlohmann::json::array({{
                                    {"type", "function"},
                                    {"function", {{"name", "get_weather"},
                                                  {"parameters", {{"type", "object"}}}}}}})}}));
  REQUIRE(tools);
  REQUIRE(tools->status == 200);
  CHECK(f.log().last_request()->traffic == actors::traffic_class::agent);
}

TEST_CASE("models, health, readiness and metrics answer") {
  server_fixture f([](actors::entrypoint_params& p) { p.models = {test_model, "other-model"}; });
  auto models = http_call(f.port(), "GET", "/v1/models");
  REQUIRE(models);
  CHECK(models->status == 200);
  auto j = parse(models->body);
  CHECK(j["object"] == "list");
  REQUIRE(j["data"].size() == 2);
  CHECK(j["data"][0]["id"] == test_model);
  CHECK(j["data"][0]["object"] == "model");
  CHECK(j["data"][0]["owned_by"] == "troupe");

  auto one = http_call(f.port(), "GET", std::string("/v1/models/") + test_model);
  REQUIRE(one);
  CHECK(one->status == 200);
  CHECK(parse(one->body)["id"] == test_model);

  auto health = http_call(f.port(), "GET", "/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  auto ready = http_call(f.port(), "GET", "/ready");
  REQUIRE(ready);
  CHECK(ready->status == 200);
  f.server().set_ready(false);
  auto not_ready = http_call(f.port(), "GET", "/ready");
  REQUIRE(not_ready);
  CHECK(not_ready->status == 503);
  CHECK(parse(not_ready->body).contains("error"));
  f.server().set_ready(true);

  REQUIRE(f.post("/v1/chat/completions", chat_body({{"stream", true}})));
  auto metrics = http_call(f.port(), "GET", "/metrics");
  REQUIRE(metrics);
  CHECK(metrics->status == 200);
  CHECK(metrics->header("content-type").find("text/plain; version=0.0.4") == 0);
  for (const char* name : {"troupe_http_requests_total", "troupe_http_time_to_first_token_seconds",
                           "troupe_http_inter_token_latency_seconds",
                           "troupe_http_requests_in_flight", "troupe_http_requests_queued",
                           "troupe_http_connections_open", "troupe_http_generated_tokens_total"})
    CHECK_MESSAGE(metrics->body.find(std::string("# TYPE ") + name) != std::string::npos, name);
  CHECK(f.metric(R"(troupe_http_requests_total{route="/v1/chat/completions",status="200"})")
        == 1);
  CHECK(f.metric(R"(troupe_http_requests_total{route="/ready",status="503"})") == 1);
  CHECK(f.metric(R"(troupe_http_time_to_first_token_seconds_count{route="/v1/chat/completions"})")
        == 1);
  // The gauges settle once the server has finished with the request, which may be just after
  // the client has read the last byte.
  CHECK(server_fixture::eventually([&] { return f.metric("troupe_http_requests_in_flight") == 0; }));
  CHECK(server_fixture::eventually([&] { return f.metric("troupe_http_requests_queued") == 0; }));
}

TEST_CASE("metrics registered by the graph in the same registry are served too") {
  server_fixture f;
  auto c = f.registry().add_counter("troupe_graph_test_total", "A graph metric.");
  REQUIRE(c);
  (*(*c)->with({}))->inc(5);
  auto metrics = http_call(f.port(), "GET", "/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("troupe_graph_test_total 5") != std::string::npos);
}

TEST_CASE("one connection serves requests one after another, and pipelined ones in order") {
  server_fixture f;
  http_client c(f.port());
  REQUIRE(c.connect());
  for (int i = 0; i < 3; ++i) {
    REQUIRE(c.send_request("POST", "/v1/chat/completions", chat_body({{"stream", i == 1}})));
    auto r = c.read_reply();
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->keep_alive);
  }
  // Two requests sent at once: both answered, in order.
  const std::string one = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string two = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          + std::to_string(chat_body().size()) + "\r\n\r\n" + chat_body();
  REQUIRE(c.send_raw(two + one));
  auto a = c.read_reply();
  auto b = c.read_reply();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(json::parse(a->body)["object"] == "chat.completion");
  CHECK(b->body == R"({"status":"ok"})");
}

TEST_CASE("an SSE frame names the event by the object's type, except for Chat Completions") {
  using recipe::protocol;
  CHECK(actors::sse_frame(protocol::chat_completions, R"({"a":1})") == "data: {\"a\":1}\n\n");
  CHECK(actors::sse_frame(protocol::messages, R"({"type":"ping"})")
        == "event: ping\ndata: {\"type\":\"ping\"}\n\n");
  CHECK(actors::sse_frame(protocol::responses, R"({"sequence_number":1,"type":"x.y"})")
        == "event: x.y\ndata: {\"sequence_number\":1,\"type\":\"x.y\"}\n\n");
}

TEST_CASE("an HTTP/1.0 client gets the stream unchunked and the connection closed") {
  server_fixture f;
  const std::string body = chat_body({{"stream", true}});
  http_client c(f.port());
  REQUIRE(c.connect());
  REQUIRE(c.send_raw("POST /v1/chat/completions HTTP/1.0\r\nContent-Length: "
                     + std::to_string(body.size()) + "\r\n\r\n" + body));
  // The body has no length and no chunks: the reply is complete only once the server closed.
  auto r = c.read_reply();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("transfer-encoding").empty());
  CHECK(r->header("content-length").empty());
  CHECK(r->header("connection") == "close");
  bool done = false;
  CHECK(chat_stream_text(data_objects(r->body, &done)) == reply_text);
  CHECK(done);
}

// Responses and Messages streaming events: exact event logs against deepseek_recipe 0.2.0's stream
// processor (tools/stream_events_golden.py), the same events for every split of the ids, and the
// error event shapes (OpenAI spec's ResponseErrorEvent; Anthropic's documented error event).
#include "recipe/messages.hpp"
#include "recipe/recipe.hpp"
#include "recipe/responses.hpp"
#include "recipe/stream_events.hpp"
#include "recipe_fixture.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <regex>
#include <string>
#include <vector>

using namespace troupe::recipe;
using ojson = nlohmann::ordered_json;

namespace {
using testing::v4;

std::vector<ojson> golden() { return testing::json_records(testing::golden_path("stream_events.v4.jsonl.gz")); }

backend_finish finish_of(const std::string& s) {
  return s == "length" ? backend_finish::length
       : s == "content_filter" ? backend_finish::content_filter : backend_finish::stop;
}

// A golden record's request, parsed by our parser of its protocol.
struct parsed {
  conversation conv;
  sampling_params params;
  responses_request responses;  // the Responses request (its echo) when the protocol is Responses
};

parsed parse(const ojson& r) {
  const std::string body = r.at("request").dump();
  parsed p;
  if (r.at("protocol") == "responses") {
    auto res = parse_responses(body);
    REQUIRE(std::holds_alternative<responses_request>(res));
    p.responses = std::get<responses_request>(res);
    p.conv = p.responses.conversation;
    p.params = p.responses.params;
  } else {
    auto res = parse_messages(body);
    REQUIRE(std::holds_alternative<messages_request>(res));
    p.conv = std::get<messages_request>(res).conversation;
    p.params = std::get<messages_request>(res).params;
  }
  return p;
}

event_stream_options renderer_options(const ojson& r) {
  event_stream_options o;
  o.id = r.at("id");
  o.model = "DeepSeek-V4-Pro";
  o.prompt_tokens = r.at("prompt_tokens");
  o.tool_call_id = [](int i) { return "call_0" + std::to_string(i) + "_X"; };
  return o;
}

bool starts_in_reasoning(const stream_options& o) {
  return o.start == stream_start::reasoning || o.start == stream_start::reasoning_continuation;
}

// Feeds the ids in the chunks `cuts` defines (sorted positions; none = one id per chunk) and
// renders every event, as a server streams them.
std::vector<std::string> render(const ojson& r, const std::vector<token_id>& ids,
                                const std::optional<std::vector<std::size_t>>& cuts) {
  const parsed p = parse(r);
  stream_options so = stream_options_for(p.conv, r.at("prompt_tokens").get<std::uint64_t>());
  so.stop = p.params.stop;
  auto made = stream_parser::create(v4(), so);
  REQUIRE(std::holds_alternative<stream_parser>(made));
  stream_parser parser = std::get<stream_parser>(std::move(made));
  std::vector<std::string> out;
  const bool responses = r.at("protocol") == "responses";
  std::optional<responses_event_renderer> rr;
  std::optional<messages_event_renderer> mr;
  if (responses) rr.emplace(renderer_options(r), p.responses);
  else mr.emplace(renderer_options(r), starts_in_reasoning(so));
  auto emit = [&](const std::vector<stream_event>& ev) {
    if (rr) rr->render(ev, out);
    else mr->render(ev, out);
  };
  if (rr) rr->start(out);
  else mr->start(out);
  std::vector<std::size_t> bounds;
  if (cuts) bounds = *cuts;
  else for (std::size_t i = 1; i < ids.size(); ++i) bounds.push_back(i);
  bounds.push_back(ids.size());
  std::size_t from = 0;
  for (std::size_t to : bounds) {
    std::vector<stream_event> ev;
    parser.push(std::span<const token_id>(ids.data() + from, to - from), ev);
    emit(ev);
    from = to;
  }
  std::vector<stream_event> ev;
  parser.finish(finish_of(r.at("finish")), ev);
  emit(ev);
  return out;
}

// Adjacent deltas of one item / block merged, sequence numbers renumbered: the reference writes
// one delta per token, ours one per merged delta.
std::vector<ojson> merged(const std::vector<ojson>& events) {
  std::vector<ojson> out;
  for (const ojson& e : events) {
    const std::string type = e.at("type");
    if (!out.empty() && out.back().at("type") == type) {
      ojson& last = out.back();
      if (type.ends_with(".delta") && last.at("item_id") == e.at("item_id")) {
        last["delta"] = last["delta"].get<std::string>() + e.at("delta").get<std::string>();
        continue;
      }
      if (type == "content_block_delta" && last.at("index") == e.at("index")
          && last["delta"]["type"] == e["delta"]["type"] && e["delta"]["type"] != "signature_delta") {
        const char* field = e["delta"]["type"] == "thinking_delta" ? "thinking"
                            : e["delta"]["type"] == "text_delta"   ? "text"
                                                                   : "partial_json";
        last["delta"][field] = last["delta"][field].get<std::string>() + e["delta"][field].get<std::string>();
        continue;
      }
    }
    out.push_back(e);
  }
  std::uint64_t seq = 0;
  for (ojson& e : out)
    if (e.contains("sequence_number")) e["sequence_number"] = seq++;
  return out;
}

std::vector<ojson> parse_all(const std::vector<std::string>& events) {
  std::vector<ojson> out;
  for (const auto& e : events) out.push_back(ojson::parse(e));
  return out;
}

std::vector<token_id> ids_of(const ojson& r) {
  std::vector<token_id> ids;
  for (const auto& id : r.at("ids")) ids.push_back(id.get<token_id>());
  return ids;
}

}  // namespace

TEST_CASE("stream events: Responses and Messages event logs equal deepseek_recipe's") {
  const auto records = golden();
  int responses = 0, messages = 0;
  for (const auto& r : records) {
    const std::string name = r.at("name").get<std::string>() + " / " + r.at("protocol").get<std::string>();
    CAPTURE(name);
    // Responses: the reference's events with what the OpenAI spec requires put right (no null
    // `user` / `usage`, `cache_write_tokens`, the function `name` in arguments.done), each event
    // valid by the spec's schema of its type (checked at golden time: spec_valid).
    const bool is_responses = r.at("protocol") == "responses";
    if (is_responses) CHECK(r.at("spec_valid").get<bool>());
    std::vector<ojson> ref;
    for (const auto& pair : r.at(is_responses ? "spec_events" : "events")) {
      ojson e = pair.at(1);
      CHECK(pair.at(0) == e.at("type"));  // the SSE event name is the type
      ref.push_back(std::move(e));
    }
    const std::vector<ojson> ours = parse_all(render(r, ids_of(r), std::nullopt));
    const auto a = merged(ours), b = merged(ref);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      CHECK(a[i].dump() == b[i].dump());  // key order included
    }
    (is_responses ? responses : messages)++;
  }
  CHECK(responses >= 41);
  CHECK(messages >= 51);
}

TEST_CASE("stream events: every split point and random chunkings give the same events") {
  std::mt19937_64 rng(8);
  for (const auto& r : golden()) {
    CAPTURE(r.at("name").get<std::string>());
    const auto ids = ids_of(r);
    const std::string whole = ojson(merged(parse_all(render(r, ids, std::vector<std::size_t>{})))).dump();
    for (std::size_t cut = 0; cut <= ids.size(); ++cut)
      REQUIRE(ojson(merged(parse_all(render(r, ids, std::vector<std::size_t>{cut})))).dump() == whole);
    for (int trial = 0; trial < 10; ++trial) {
      std::vector<std::size_t> cuts;
      for (std::size_t i = 1; i < ids.size(); ++i)
        if (rng() % 3 == 0) cuts.push_back(i);
      REQUIRE(ojson(merged(parse_all(render(r, ids, cuts)))).dump() == whole);
    }
  }
}

TEST_CASE("stream events: sequence numbers count every Responses event from 0") {
  for (const auto& r : golden()) {
    if (r.at("protocol") != "responses") continue;
    const auto events = parse_all(render(r, ids_of(r), std::nullopt));
    for (std::size_t i = 0; i < events.size(); ++i) REQUIRE(events[i].at("sequence_number") == i);
    CHECK(events.front().at("type") == "response.created");
    const std::string last = events.back().at("type");
    CHECK((last == "response.completed" || last == "response.incomplete"));
  }
}

TEST_CASE("stream events: error events") {
  api_error e{400, "bad value", "invalid_request_error", std::string("input"), std::nullopt};
  responses_request req;
  event_stream_options eo;
  eo.id = "resp_1";
  eo.model = "m";
  responses_event_renderer rr(eo, req);
  std::vector<std::string> out;
  rr.start(out);
  // OpenAI spec, ResponseErrorEvent: required type, code, message, param, sequence_number.
  const ojson re = ojson::parse(rr.error(e));
  CHECK(re.dump() == R"({"type":"error","code":null,"message":"bad value","param":"input","sequence_number":2})");
  // Anthropic: {"type": "error", "error": {"type": ..., "message": ...}}.
  const ojson me = ojson::parse(messages_event_renderer::error(e));
  CHECK(me.dump() == R"({"type":"error","error":{"type":"invalid_request_error","message":"bad value"}})");
}

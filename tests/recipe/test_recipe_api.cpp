// recipe/recipe.hpp: loading fails as a value, requests encode to the golden prompts (with and
// without the pool), the stream options follow deepseek_recipe's parsing options, and a request's
// parser turns the golden generated ids into the golden events.
#include "recipe/recipe.hpp"
#include "recipe_fixture.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

using namespace troupe::recipe;

namespace {
const std::string k_tok = std::string(TROUPE_SOURCE_DIR) + "/recipe/data/deepseek-v4/tokenizer.json.gz";

codec load_v4(unsigned threads = 1) {
  codec_options o;
  o.threads = threads;
  o.parallel.min_piece_bytes = 16;
  auto r = codec::load(k_tok, o);
  REQUIRE(std::holds_alternative<codec>(r));
  return std::get<codec>(std::move(r));
}
}  // namespace

TEST_CASE("codec: load failures are values") {
  auto missing = codec::load("/nonexistent/tokenizer.json");
  REQUIRE(std::holds_alternative<load_error>(missing));
  CHECK(std::get<load_error>(missing).message.find("not found") != std::string::npos);

  const std::string bad = (std::filesystem::temp_directory_path() / "troupe_test_truncated_tokenizer.json").string();
  std::ofstream(bad) << "{\"model\": ";
  auto malformed = codec::load(bad);
  std::remove(bad.c_str());
  REQUIRE(std::holds_alternative<load_error>(malformed));
  CHECK(std::get<load_error>(malformed).message.find(bad) == 0);

  auto file = nlohmann::json::parse(testing::gunzip(k_tok));
  file["added_tokens"] = nlohmann::json::array();
  auto no_markers = codec::from_json(file.dump());
  REQUIRE(std::holds_alternative<load_error>(no_markers));
  CHECK(std::get<load_error>(no_markers).message.find("has no token <｜User｜>") != std::string::npos);
}

TEST_CASE("codec: tokenize / detokenize") {
  const codec c = load_v4();
  const std::string text = "Hello <｜begin▁of▁sentence｜> world";
  const auto plain = c.tokenize(text);
  const auto trusted = c.tokenize(text, encode_mode::trusted);
  const auto bos = *c.tokenizer().token_to_id("<｜begin▁of▁sentence｜>");
  CHECK(std::find(plain.begin(), plain.end(), bos) == plain.end());  // special: split in plain mode
  CHECK(std::find(trusted.begin(), trusted.end(), bos) != trusted.end());
  CHECK(c.detokenize(plain) == text);
  CHECK(c.detokenize(trusted) == text);
  CHECK(c.detokenize(trusted, true) == "Hello  world");
  const codec pooled = load_v4(2);
  const std::string long_text = testing::gunzip(testing::golden_path("corpus.jsonl.gz")).substr(0, 300000);
  CHECK(pooled.tokenize(long_text, encode_mode::raw) == c.tokenize(long_text, encode_mode::raw));
}

TEST_CASE("codec: Chat Completions requests encode to the golden prompts, with and without a pool") {
  const codec c1 = load_v4(1), c2 = load_v4(2);
  std::size_t n = 0;
  for (const auto& rec : testing::json_records(testing::golden_path("chat_completions.v4.jsonl.gz"))) {
    if (rec.contains("error")) continue;
    CAPTURE(rec.at("name").get<std::string>());
    for (const codec* c : {&c1, &c2}) {
      auto r = c->encode(protocol::chat_completions, rec.at("request").dump());
      REQUIRE(std::holds_alternative<encoded_request>(r));
      const auto& e = std::get<encoded_request>(r);
      CHECK(e.prompt.text == rec.at("prompt").get<std::string>());
      CHECK(e.prompt.ids == rec.at("ids").get<std::vector<token_id>>());
      CHECK(e.stream.prompt_tokens == e.prompt.ids.size());
    }
    ++n;
  }
  CHECK(n >= 39);
  auto bad = c1.encode(protocol::chat_completions, R"({"model": "m", "messages": [{"role": "wizard"}]})");
  REQUIRE(std::holds_alternative<api_error>(bad));
  CHECK(std::get<api_error>(bad).param == "messages[0].role");
  CHECK(protocol_from_name("chat") == protocol::chat_completions);
  CHECK_FALSE(protocol_from_name("smoke-signals").has_value());
}

TEST_CASE("codec: stream options and parser of a request match the reference") {
  const codec c = load_v4();
  for (const auto& rec : testing::json_records(testing::golden_path("stream.v4.jsonl.gz"))) {
    const std::string name = rec.at("name");
    CAPTURE(name);
    auto r = c.encode(protocol::chat_completions, rec.at("request").dump());
    REQUIRE(std::holds_alternative<encoded_request>(r));
    auto req = std::get<encoded_request>(std::move(r));
    const std::string th = rec.at("thinking").is_null() ? "" : rec.at("thinking").get<std::string>();
    const stream_start want = rec.at("starts_in_tool_calls").get<bool>() ? stream_start::tool_calls
                            : th.empty() ? stream_start::content
                            : th == "ReasoningStart" ? stream_start::reasoning
                            : th == "ReasoningContinuation" ? stream_start::reasoning_continuation
                            : stream_start::content_continuation;
    CHECK(req.stream.start == want);
    CHECK(req.stream.parse_tool_calls == rec.at("parse_tool_calls").get<bool>());
    // The golden's usage counts 37 prompt tokens.
    req.stream.prompt_tokens = rec.at("prompt_tokens").get<std::uint64_t>();
    stream_parser p = c.create_stream_parser(req);
    std::vector<stream_event> out;
    p.push(rec.at("ids").get<std::vector<token_id>>(), out);
    const std::string fin = rec.at("finish");
    p.finish(fin == "length" ? backend_finish::length : fin == "content_filter" ? backend_finish::content_filter
                                                                                : backend_finish::stop, out);
    // Text of all deltas and the finish reason, as the golden has them.
    std::string text, reasoning, args;
    for (const auto& e : out) {
      if (e.type == stream_event::kind::text) text += e.text;
      if (e.type == stream_event::kind::reasoning) reasoning += e.text;
      if (e.type == stream_event::kind::arguments) args += e.text;
    }
    std::string want_text, want_reasoning, want_args, want_finish;
    for (const auto& e : rec.at("events")) {
      if (e[0] == "text") want_text += e[1].get<std::string>();
      if (e[0] == "reasoning") want_reasoning += e[1].get<std::string>();
      if (e[0] == "arguments") want_args += e[2].get<std::string>();
      if (e[0] == "finish") want_finish = e[1];
    }
    CHECK(text == want_text);
    CHECK(reasoning == want_reasoning);
    CHECK(args == want_args);
    CHECK(to_string(out[out.size() - 2].finish) == want_finish);
  }
}

TEST_CASE("codec: Responses and Messages requests encode to the golden prompts; errors in each shape") {
  codec_options o;
  o.chat.models = {"DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"};  // the reference's model list
  auto loaded = codec::load(k_tok, o);
  REQUIRE(std::holds_alternative<codec>(loaded));
  const codec& c = std::get<codec>(loaded);
  for (const auto& [file, p] : {std::pair{"responses.v4.jsonl.gz", protocol::responses},
                                std::pair{"messages.v4.jsonl.gz", protocol::messages}}) {
    std::size_t accepted = 0, rejected = 0;
    for (const auto& rec : testing::json_records(testing::golden_path(file))) {
      CAPTURE(rec.at("name").get<std::string>());
      const std::string body = rec.at("request").is_string() ? rec.at("request").get<std::string>()
                                                             : rec.at("request").dump();
      auto r = c.encode(p, body);
      if (rec.contains("error")) {
        REQUIRE(std::holds_alternative<api_error>(r));
        const auto j = nlohmann::json::parse(error_json(p, std::get<api_error>(r)));
        if (p == protocol::messages) {
          CHECK(j.at("type") == "error");
          CHECK(j.at("error").at("type").is_string());
          CHECK(j.at("error").at("message").is_string());
        } else {
          CHECK(j.at("error").at("message").is_string());
          CHECK(j.at("error").contains("param"));
          CHECK(j.at("error").contains("code"));
        }
        ++rejected;
        continue;
      }
      REQUIRE(std::holds_alternative<encoded_request>(r));
      const auto& e = std::get<encoded_request>(r);
      CHECK(e.protocol == p);
      CHECK(e.prompt.text == rec.at("prompt").get<std::string>());
      CHECK(e.prompt.ids == rec.at("ids").get<std::vector<token_id>>());
      ++accepted;
    }
    CHECK(accepted >= 30);
    CHECK(rejected >= 10);
  }
  CHECK(protocol_from_name("responses") == protocol::responses);
  CHECK(protocol_from_name("messages") == protocol::messages);
  CHECK(to_string(protocol::messages) == "messages");
}

TEST_CASE("codec: a request's stream renderer writes its protocol's events") {
  const codec c = load_v4();
  std::size_t n = 0;
  for (const auto& rec : testing::json_records(testing::golden_path("stream_events.v4.jsonl.gz"))) {
    const std::string name = rec.at("name").get<std::string>() + " / " + rec.at("protocol").get<std::string>();
    CAPTURE(name);
    const protocol p = *protocol_from_name(rec.at("protocol").get<std::string>());
    auto r = c.encode(p, rec.at("request").dump());
    REQUIRE(std::holds_alternative<encoded_request>(r));
    auto req = std::get<encoded_request>(std::move(r));
    req.stream.prompt_tokens = rec.at("prompt_tokens").get<std::uint64_t>();
    stream_parser parser = c.create_stream_parser(req);
    event_stream_options eo;
    eo.id = rec.at("id");
    stream_renderer render(req, eo);  // prompt tokens from the request (37, as the golden's)
    std::vector<std::string> out;
    render.start(out);
    std::vector<stream_event> ev;
    parser.push(rec.at("ids").get<std::vector<token_id>>(), ev);
    const std::string fin = rec.at("finish");
    parser.finish(fin == "length" ? backend_finish::length : fin == "content_filter" ? backend_finish::content_filter
                                                                                     : backend_finish::stop, ev);
    render.render(ev, out);
    // The event types in order (the reference's deltas, one per token, collapsed).
    auto types = [](const std::vector<std::string>& v) {
      std::vector<std::string> t;
      for (const auto& s : v) {
        const std::string type = nlohmann::json::parse(s).at("type");
        if (!t.empty() && t.back() == type && type.find("delta") != std::string::npos && type != "message_delta") continue;
        t.push_back(type);
      }
      return t;
    };
    std::vector<std::string> ref;
    for (const auto& e : rec.at("events")) ref.push_back(e.at(1).dump());
    CHECK(types(out) == types(ref));
    // The end: the Responses status and token counts; the Messages stop reason and usage.
    const auto ours = nlohmann::json::parse(out.size() > 1 ? out[out.size() - 2] : out.back());
    const auto theirs = nlohmann::json::parse(ref.size() > 1 ? ref[ref.size() - 2] : ref.back());
    if (p == protocol::responses) {
      const auto a = nlohmann::json::parse(out.back()).at("response"), b = nlohmann::json::parse(ref.back()).at("response");
      CHECK(a.at("status") == b.at("status"));
      CHECK(a.at("usage").at("output_tokens") == b.at("usage").at("output_tokens"));
      CHECK(a.at("usage").at("output_tokens_details") == b.at("usage").at("output_tokens_details"));
    } else {
      CHECK(ours == theirs);  // message_delta
    }
    ++n;
  }
  CHECK(n >= 92);
}

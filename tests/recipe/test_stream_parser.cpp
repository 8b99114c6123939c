// The streaming output parser: exact event logs against deepseek_recipe 0.2.0's stream processor
// (tools/stream_golden.py), the Chat Completions chunk shape, chunking invariance (every split
// point and random chunkings), early release (only a possible tag start, trimmable newlines or an
// unfinished UTF-8 character are held) and the safety rule (control strings spelled with ordinary
// tokens are text).
#include "recipe/stream_parser.hpp"
#include "recipe/tokenizer.hpp"
#include "recipe_fixture.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <set>
#include <string>
#include <vector>

using namespace troupe::recipe;
using json = nlohmann::json;

namespace {
using testing::v4;

std::vector<nlohmann::ordered_json> golden() {
  return testing::json_records(testing::golden_path("stream.v4.jsonl.gz"));
}

stream_options options_of(const nlohmann::ordered_json& r) {
  stream_options o;
  o.parse_tool_calls = r.at("parse_tool_calls").get<bool>();
  o.prompt_tokens = r.at("prompt_tokens").get<std::uint64_t>();
  if (r.at("request").contains("stop")) o.stop = r.at("request").at("stop").get<std::vector<std::string>>();
  if (r.at("starts_in_tool_calls").get<bool>()) o.start = stream_start::tool_calls;
  else if (r.at("thinking").is_null()) o.start = stream_start::content;
  else if (r.at("thinking") == "ReasoningStart") o.start = stream_start::reasoning;
  else if (r.at("thinking") == "ReasoningContinuation") o.start = stream_start::reasoning_continuation;
  else o.start = stream_start::content_continuation;
  return o;
}

backend_finish finish_of(const std::string& s) {
  return s == "length" ? backend_finish::length
       : s == "content_filter" ? backend_finish::content_filter : backend_finish::stop;
}

stream_parser make(const stream_options& o) {
  auto r = stream_parser::create(v4(), o);
  REQUIRE(std::holds_alternative<stream_parser>(r));
  return std::get<stream_parser>(std::move(r));
}

// Our events in the golden's neutral form, adjacent deltas of one kind merged.
json neutral(const std::vector<stream_event>& events) {
  json out = json::array();
  for (const auto& e : events) {
    using k = stream_event::kind;
    auto& last = out.empty() ? out : out.back();
    const bool merge = !out.empty()
                       && ((e.type == k::text && last[0] == "text")
                           || (e.type == k::reasoning && last[0] == "reasoning")
                           || (e.type == k::arguments && last[0] == "arguments" && last[1] == e.index));
    if (merge) {
      auto& s = e.type == k::arguments ? last[2] : last[1];
      s = s.get<std::string>() + e.text;
      continue;
    }
    switch (e.type) {
      case k::text: out.push_back({"text", e.text}); break;
      case k::reasoning: out.push_back({"reasoning", e.text}); break;
      case k::tool_call: out.push_back({"tool_call", e.index, e.text}); break;
      case k::arguments: out.push_back({"arguments", e.index, e.text}); break;
      case k::finish: out.push_back({"finish", std::string(to_string(e.finish))}); break;
      case k::usage: {
        json r = e.usage.reasoning_tokens ? json(*e.usage.reasoning_tokens) : json(nullptr);
        out.push_back({"usage", e.usage.prompt_tokens, e.usage.completion_tokens, r});
        break;
      }
    }
  }
  return out;
}

// Chat Completions chunks -> the neutral form (as tools/stream_golden.py maps the reference's).
json neutral_of_chunks(const std::vector<std::string>& chunks) {
  std::vector<stream_event> ev;
  auto add = [&](stream_event::kind k, std::string s, int index = 0) {
    stream_event e;
    e.type = k;
    e.text = std::move(s);
    e.index = index;
    ev.push_back(std::move(e));
  };
  for (const auto& text : chunks) {
    const json c = json::parse(text);
    for (const auto& ch : c.at("choices")) {
      const auto& d = ch.at("delta");
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string()
          && !d["reasoning_content"].get<std::string>().empty())
        add(stream_event::kind::reasoning, d["reasoning_content"]);
      if (d.contains("content") && d["content"].is_string() && !d["content"].get<std::string>().empty())
        add(stream_event::kind::text, d["content"]);
      if (d.contains("tool_calls"))
        for (const auto& tc : d["tool_calls"]) {
          const int i = tc.at("index").get<int>();
          if (tc.contains("id")) add(stream_event::kind::tool_call, tc["function"]["name"], i);
          const auto a = tc["function"].value("arguments", std::string());
          if (!a.empty()) add(stream_event::kind::arguments, a, i);
        }
      if (ch.at("finish_reason").is_string()) {
        stream_event e;
        e.type = stream_event::kind::finish;
        const auto f = ch["finish_reason"].get<std::string>();
        e.finish = f == "length" ? finish_reason::length : f == "tool_calls" ? finish_reason::tool_calls
                 : f == "content_filter" ? finish_reason::content_filter : finish_reason::stop;
        ev.push_back(e);
      }
    }
    if (c.contains("usage") && c["usage"].is_object()) {
      stream_event e;
      e.type = stream_event::kind::usage;
      e.usage.prompt_tokens = c["usage"]["prompt_tokens"];
      e.usage.completion_tokens = c["usage"]["completion_tokens"];
      if (c["usage"].contains("completion_tokens_details"))
        e.usage.reasoning_tokens = c["usage"]["completion_tokens_details"]["reasoning_tokens"].get<std::uint64_t>();
      ev.push_back(e);
    }
  }
  return neutral(ev);
}

// Feeds `ids` in the chunks that `cuts` (sorted positions) define and finishes.
std::vector<stream_event> run_chunked(const stream_options& o, const std::vector<token_id>& ids,
                                      const std::vector<std::size_t>& cuts, backend_finish f) {
  stream_parser p = make(o);
  std::vector<stream_event> out;
  std::size_t from = 0;
  for (std::size_t cut : cuts) {
    p.push(std::span<const token_id>(ids.data() + from, cut - from), out);
    from = cut;
  }
  p.push(std::span<const token_id>(ids.data() + from, ids.size() - from), out);
  p.finish(f, out);
  return out;
}

std::vector<token_id> trusted(std::string_view s) { return v4().encode(s, encode_mode::trusted); }

const std::string k_block =
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
    "string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

}  // namespace

TEST_CASE("stream parser: event logs equal deepseek_recipe's stream processor") {
  const auto records = golden();
  REQUIRE(records.size() >= 53);
  for (const auto& r : records) {
    CAPTURE(r.at("name").get<std::string>());
    stream_parser p = make(options_of(r));
    std::vector<stream_event> out;
    for (const auto& id : r.at("ids")) p.push(id.get<token_id>(), out);  // one id per chunk, as recorded
    p.finish(finish_of(r.at("finish")), out);
    CHECK(neutral(out).dump() == json::parse(r.at("events").dump()).dump());
  }
}

TEST_CASE("stream parser: Chat Completions chunks in the reference's shape") {
  for (const auto& r : golden()) {
    const std::string name = r.at("name");
    CAPTURE(name);
    const auto& ref = r.at("chunks");
    chat_chunk_options co;
    co.id = "chatcmpl-test";
    co.model = "DeepSeek-V4-Pro";
    co.thinking = !r.at("thinking").is_null();
    co.starts_in_reasoning = co.thinking && r.at("thinking") != "ContentContinuation";
    co.include_usage = r.at("request").contains("stream_options");
    co.tool_call_id = [](int i) { return "call_0" + std::to_string(i) + "_X"; };
    chat_chunk_renderer render(co);
    stream_parser p = make(options_of(r));
    std::vector<std::string> chunks{render.start()};
    std::vector<stream_event> all;
    for (const auto& id : r.at("ids")) {
      std::vector<stream_event> ev;
      p.push(id.get<token_id>(), ev);
      render.render(ev, chunks);
    }
    std::vector<stream_event> ev;
    p.finish(finish_of(r.at("finish")), ev);
    render.render(ev, chunks);
    // The first and the last chunk byte for byte; the ones between carry the same events.
    CHECK(json::parse(chunks.front()) == json::parse(ref.front().dump()));
    CHECK(json::parse(chunks.back()) == json::parse(ref.back().dump()));
    CHECK(neutral_of_chunks(chunks).dump() == json::parse(r.at("events").dump()).dump());
    // Every delta chunk has the key set of a reference chunk of the same kind.
    std::set<std::string> ref_shapes, our_shapes;
    auto shape = [](const json& c) {
      std::string s;
      for (auto it = c.begin(); it != c.end(); ++it) s += it.key() + ",";
      s += "|";
      const auto& d = c["choices"][0]["delta"];
      for (auto it = d.begin(); it != d.end(); ++it) s += it.key() + ",";
      return s;
    };
    for (std::size_t i = 1; i + 1 < ref.size(); ++i) ref_shapes.insert(shape(json::parse(ref[i].dump())));
    for (std::size_t i = 1; i + 1 < chunks.size(); ++i) our_shapes.insert(shape(json::parse(chunks[i])));
    CHECK(our_shapes == ref_shapes);
  }
}

TEST_CASE("stream parser: every split point and random chunkings give the same events") {
  std::vector<std::pair<stream_options, std::vector<token_id>>> cases;
  for (const auto& r : golden()) {
    std::vector<token_id> ids;
    for (const auto& id : r.at("ids")) ids.push_back(id.get<token_id>());
    cases.emplace_back(options_of(r), ids);
  }
  stream_options tools;
  tools.parse_tool_calls = true;
  // Several calls back to back, text around the block, an empty list, a reply that stops inside a
  // call: shapes other servers get wrong.
  cases.emplace_back(tools, trusted("a\n\n" + k_block + k_block));
  cases.emplace_back(tools, trusted("x<｜DSML｜tool_calls></｜DSML｜tool_calls>y"));
  cases.emplace_back(tools, trusted("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter "
                                    "name=\"k\" string=\"true\">ab</｜DSML｜para"));
  std::mt19937_64 rng(6);
  for (const auto& [o, ids] : cases) {
    const std::string whole = neutral(run_chunked(o, ids, {}, backend_finish::stop)).dump();
    for (std::size_t cut = 0; cut <= ids.size(); ++cut)
      REQUIRE(neutral(run_chunked(o, ids, {cut}, backend_finish::stop)).dump() == whole);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<std::size_t> cuts;
      for (std::size_t i = 1; i < ids.size(); ++i)
        if (rng() % 3 == 0) cuts.push_back(i);
      REQUIRE(neutral(run_chunked(o, ids, cuts, backend_finish::stop)).dump() == whole);
    }
  }
}

TEST_CASE("stream parser: known failure shapes") {
  stream_options tools;
  tools.parse_tool_calls = true;
  const auto block_ids = trusted(k_block);
  SUBCASE("begin and end markers in one chunk") {
    stream_parser p = make(tools);
    std::vector<stream_event> out;
    p.push(block_ids, out);
    REQUIRE(out.size() == 2);
    CHECK(out[0].type == stream_event::kind::tool_call);
    CHECK(out[0].text == "get_weather");
    CHECK(out[1].text == R"({"city": "Paris"})");
  }
  SUBCASE("a begin marker split across chunks: `<` is held, then becomes the tag") {
    stream_parser p = make(tools);
    std::vector<stream_event> out;
    auto ids = trusted("Sure<｜DSML｜tool_calls>");
    const auto dsml = *v4().token_to_id("｜DSML｜");
    const auto at = std::find(ids.begin(), ids.end(), dsml) - ids.begin();
    p.push(std::span<const token_id>(ids.data(), at), out);
    REQUIRE(out.size() == 1);
    CHECK(out[0].text == "Sure");  // the `<` is held back
    p.push(std::span<const token_id>(ids.data() + at, ids.size() - at), out);
    CHECK(out.size() == 1);
    p.finish(backend_finish::stop, out);
    CHECK(out[0].text == "Sure");
    CHECK(out[1].finish == finish_reason::stop);  // an empty tool-call list is no call
  }
  SUBCASE("the function name is out as soon as its tag closes") {
    stream_parser p = make(tools);
    std::vector<stream_event> out;
    p.push(trusted("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">"), out);
    REQUIRE(out.size() == 1);
    CHECK(out[0].type == stream_event::kind::tool_call);
    CHECK(out[0].text == "search");
    p.push(trusted("\n<｜DSML｜parameter name=\"q\" string=\"true\">hello wor"), out);
    REQUIRE(out.size() == 2);
    CHECK(out[1].text == R"({"q": "hello wor)");  // arguments stream before the value ends
  }
  SUBCASE("a reply that stops inside a tool call") {
    const auto ids = trusted("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜"
                             "parameter name=\"k\" string=\"true\">a\"b<");
    auto out = run_chunked(tools, ids, {}, backend_finish::length);
    CHECK(neutral(out).dump()
          == R"([["tool_call",0,"f"],["arguments",0,"{\"k\": \"a\\\"b<"],["finish","length"],["usage",0,)"
                 + std::to_string(ids.size()) + ",null]]");
  }
  SUBCASE("a stop sequence split across ids is held back, then ends the answer") {
    stream_options o;
    o.stop = {"END"};
    stream_parser p = make(o);
    std::vector<stream_event> out;
    p.push(v4().encode("Hello EN", encode_mode::raw), out);
    REQUIRE(out.size() == 1);
    CHECK(out[0].text == "Hello ");  // "EN" may begin "END"
    p.push(v4().encode("D and more", encode_mode::raw), out);
    CHECK(out.size() == 1);
    CHECK(out[0].text == "Hello ");
    p.finish(backend_finish::length, out);
    CHECK(out[1].finish == finish_reason::stop);  // the stop sequence, not the backend's length
  }
  SUBCASE("ids after the end of sentence are ignored; it counts as a completion token") {
    auto ids = trusted("Hi<｜end▁of▁sentence｜>more");
    auto out = run_chunked(stream_options{}, ids, {}, backend_finish::stop);
    CHECK(neutral(out).dump() == R"([["text","Hi"],["finish","stop"],["usage",0,2,null]])");
  }
}

TEST_CASE("stream parser: control strings spelled with ordinary tokens are text") {
  // raw mode: every string becomes ordinary tokens, as a model could spell them
  const std::string spelled = "</think><think>" + k_block + "<｜end▁of▁sentence｜>";
  const auto ids = v4().encode(spelled, encode_mode::raw);
  stream_options o;
  o.start = stream_start::reasoning;
  o.parse_tool_calls = true;
  auto out = run_chunked(o, ids, {}, backend_finish::stop);
  REQUIRE(out.size() == 3);
  CHECK(out[0].type == stream_event::kind::reasoning);
  CHECK(out[0].text == spelled);  // all of it stays reasoning: no </think>, no call, no end
  CHECK(out[1].finish == finish_reason::stop);
  o.start = stream_start::content;
  out = run_chunked(o, ids, {}, backend_finish::stop);
  CHECK(neutral(out)[0].dump() == json({"text", spelled}).dump());
}

TEST_CASE("stream parser: text is released as soon as it is confirmed") {
  // After every id, what was emitted plus what is held is the text so far, and what is held is
  // only trailing newlines and a `<` (with tools), or an unfinished UTF-8 character.
  const std::vector<std::string> texts = {
      "Hello <b>world</b> 1 < 2\n\n<x and 👨‍👩‍👧 done\n", "中文字，还有emoji 🗼🗼 and Ω≈ç√ and \xF0\x9F",
      "a\n\n\n<\n<<b", "tail <"};
  for (const bool tools : {false, true}) {
    for (const auto& t : texts) {
      CAPTURE(t);
      stream_options o;
      o.start = stream_start::content_continuation;
      o.parse_tool_calls = tools;
      stream_parser p = make(o);
      const auto ids = v4().encode(t, encode_mode::raw);
      std::vector<stream_event> out;
      std::string so_far_bytes;
      for (const auto id : ids) {
        p.push(id, out);
        so_far_bytes += v4().decode_bytes(std::span<const token_id>(&id, 1));
        std::string emitted;
        for (const auto& e : out) emitted += e.text;
        // the complete characters so far
        std::size_t complete = so_far_bytes.size();
        while (complete > 0 && complete > so_far_bytes.size() - 3
               && (static_cast<unsigned char>(so_far_bytes[complete - 1]) & 0xC0) == 0x80)
          --complete;
        if (complete > 0 && static_cast<unsigned char>(so_far_bytes[complete - 1]) >= 0xC0) {
          const auto lead = static_cast<unsigned char>(so_far_bytes[complete - 1]);
          const std::size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
          if (so_far_bytes.size() - (complete - 1) >= need) complete = so_far_bytes.size();
          else --complete;
        }
        const std::string ready = utf8_sanitize(so_far_bytes.substr(0, complete));
        REQUIRE(ready.starts_with(emitted));
        const std::string held = ready.substr(emitted.size());
        if (!tools) {
          CHECK(held.empty());
        } else {
          const auto nl_end = held.find_first_not_of('\n');
          CHECK((nl_end == std::string::npos || held.substr(nl_end) == "<"));
        }
      }
      p.finish(backend_finish::stop, out);
      std::string all;
      for (const auto& e : out) all += e.text;
      CHECK(all == v4().decode(ids));  // nothing dropped
    }
  }
}

TEST_CASE("stream parser: a tokenizer without the control tokens is an error value") {
  // the shipped file without its added tokens
  auto file = json::parse(testing::gunzip(std::string(TROUPE_SOURCE_DIR)
                                          + "/recipe/data/deepseek-v4/tokenizer.json.gz"));
  file["added_tokens"] = json::array();
  const auto tok = tokenizer::from_json(file.dump());
  auto r = stream_parser::create(tok, {});
  REQUIRE(std::holds_alternative<std::string>(r));
  CHECK(std::get<std::string>(r).find("</think>") != std::string::npos);
}

namespace {
// The ids (positions) the text events name, in order.
std::vector<std::uint32_t> answer_ids(const std::vector<stream_event>& events) {
  std::vector<std::uint32_t> out;
  for (const auto& e : events)
    if (e.type == stream_event::kind::text) out.insert(out.end(), e.tokens.begin(), e.tokens.end());
  return out;
}

std::string bytes_of(const std::vector<token_id>& ids, const std::vector<std::uint32_t>& at) {
  std::string s;
  for (const auto i : at) s += v4().decode_bytes(std::span<const token_id>(&ids[i], 1));
  return s;
}

// `s` without leading and trailing newlines (which a token may carry beside its answer bytes).
std::string trim_newlines(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.substr(std::min(s.find_first_not_of('\n'), s.size()));
}

std::string answer_text(const std::vector<stream_event>& events) {
  std::string s;
  for (const auto& e : events)
    if (e.type == stream_event::kind::text) s += e.text;
  return s;
}
}  // namespace

TEST_CASE("stream parser: text events name the ids of the answer text") {
  const auto eos = *v4().token_to_id("<｜end▁of▁sentence｜>");
  SUBCASE("every id of a plain answer but the end of sentence") {
    auto ids = trusted("Hello, world! Ünïcödé and 中文 too.");
    ids.push_back(eos);
    const auto out = run_chunked({}, ids, {}, backend_finish::stop);
    std::vector<std::uint32_t> want(ids.size() - 1);
    for (std::uint32_t i = 0; i < want.size(); ++i) want[i] = i;
    CHECK(answer_ids(out) == want);
    CHECK(bytes_of(ids, answer_ids(out)) == answer_text(out));
  }
  SUBCASE("not the reasoning, nor the newlines trimmed, nor </think>") {
    stream_options o;
    o.start = stream_start::reasoning;
    const auto reasoning = trusted("\nLet me think.\n\n");
    const auto answer = trusted("\n\nThe answer.");
    auto ids = reasoning;
    ids.push_back(*v4().token_to_id("</think>"));
    ids.insert(ids.end(), answer.begin(), answer.end());
    const auto out = run_chunked(o, ids, {}, backend_finish::stop);
    CHECK(answer_text(out) == "The answer.");
    CHECK(trim_newlines(bytes_of(ids, answer_ids(out))) == "The answer.");
    CHECK(answer_ids(out).front() > reasoning.size());
  }
  SUBCASE("not the tool calls, nor the `<` that opened them") {
    stream_options tools;
    tools.parse_tool_calls = true;
    const auto ids = trusted("Sure.\n\n" + k_block);
    const auto out = run_chunked(tools, ids, {}, backend_finish::stop);
    CHECK(answer_text(out) == "Sure.");
    CHECK(trim_newlines(bytes_of(ids, answer_ids(out))) == "Sure.");
  }
  SUBCASE("a stop sequence: the ids with a byte before it") {
    stream_options o;
    o.stop = {"END"};
    const auto ids = v4().encode("Hello ENOUGH, then END and more", encode_mode::raw);
    const auto out = run_chunked(o, ids, {}, backend_finish::length);
    CHECK(answer_text(out) == "Hello ENOUGH, then ");
    const std::string spelled = bytes_of(ids, answer_ids(out));
    CHECK(spelled.starts_with("Hello ENOUGH, then "));
    CHECK(spelled.size() <= std::string("Hello ENOUGH, then END").size());
  }
  SUBCASE("the same ids however the stream is cut, each once, in order") {
    for (const auto& r : golden()) {
      CAPTURE(r.at("name").get<std::string>());
      std::vector<token_id> ids;
      for (const auto& id : r.at("ids")) ids.push_back(id.get<token_id>());
      const auto o = options_of(r);
      const auto whole = answer_ids(run_chunked(o, ids, {}, backend_finish::stop));
      for (std::size_t i = 1; i < whole.size(); ++i) REQUIRE(whole[i - 1] < whole[i]);
      if (!whole.empty()) REQUIRE(whole.back() < ids.size());
      for (std::size_t cut = 0; cut <= ids.size(); ++cut)
        REQUIRE(answer_ids(run_chunked(o, ids, {cut}, backend_finish::stop)) == whole);
    }
  }
}

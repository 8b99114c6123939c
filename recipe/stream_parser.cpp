#include "recipe/stream_parser.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

namespace troupe::recipe {
namespace {

constexpr std::string_view k_end_think = "</think>";
constexpr std::string_view k_think = "<think>";
constexpr std::string_view k_dsml = "｜DSML｜";
constexpr std::string_view k_eos = "<｜end▁of▁sentence｜>";
constexpr std::size_t k_max_tag = 64;        // a content / value tag longer than this is text
constexpr std::size_t k_max_block_tag = 4096;  // an invoke / parameter tag (names) longer: dropped

// The number of trailing bytes of `s` that form an unfinished but still possibly valid UTF-8
// sequence (0 to 3).
std::size_t incomplete_tail(std::string_view s) {
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    std::size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (need <= back) return 0;  // complete, ASCII or an invalid lead: nothing to wait for
    if (back >= 2) {             // the second byte's range depends on the lead
      const auto c2 = static_cast<unsigned char>(s[n - back + 1]);
      const unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
      const unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
      if (c2 < lo || c2 > hi) return 0;
    }
    return back;
  }
  return 0;
}

// The value of attribute `name` in a DSML tag's text (`invoke name="x"`), or nullopt.
std::optional<std::string> attribute(std::string_view tag, std::string_view name) {
  std::size_t pos = 0;
  while ((pos = tag.find(name, pos)) != std::string_view::npos) {
    const bool word_start = pos == 0 || tag[pos - 1] == ' ' || tag[pos - 1] == '\n';
    const std::size_t eq = pos + name.size();
    if (word_start && tag.substr(eq, 2) == "=\"") {
      const std::size_t end = tag.find('"', eq + 2);
      if (end == std::string_view::npos) return std::nullopt;
      return std::string(tag.substr(eq + 2, end - eq - 2));
    }
    pos = eq;
  }
  return std::nullopt;
}

std::string_view first_word(std::string_view tag) {
  const std::size_t end = tag.find_first_of(" \n\t");
  return tag.substr(0, end);
}

bool mergeable(stream_event::kind k) {
  return k == stream_event::kind::text || k == stream_event::kind::reasoning
         || k == stream_event::kind::arguments;
}

}  // namespace

std::string_view to_string(finish_reason r) {
  switch (r) {
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::tool_calls: return "tool_calls";
    case finish_reason::content_filter: return "content_filter";
  }
  return "stop";
}

void json_escape(std::string_view s, std::string& out) {
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          std::array<char, 8> buf{};
          std::snprintf(buf.data(), buf.size(), "\\u%04x", c);
          out += buf.data();
        } else {
          out += ch;
        }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// stream_parser

std::variant<stream_parser, std::string> stream_parser::create(const tokenizer& tok,
                                                               stream_options options) {
  std::array<token_id, 4> ids{};
  const std::array<std::string_view, 4> names{k_end_think, k_think, k_dsml, k_eos};
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto id = tok.token_to_id(names[i]);
    if (!id) return "stream parser: the tokenizer has no control token " + std::string(names[i]);
    ids[i] = *id;
  }
  return stream_parser(tok, options, ids[0], ids[1], ids[2], ids[3]);
}

stream_parser::stream_parser(const tokenizer& tok, stream_options options, token_id end_think,
                             token_id think, token_id dsml, token_id eos)
    : tok_(&tok), opt_(options), end_think_(end_think), think_(think), dsml_(dsml), eos_(eos) {
  usage_.prompt_tokens = opt_.prompt_tokens;
  usage_.cached_prompt_tokens = opt_.cached_prompt_tokens;
  switch (opt_.start) {
    case stream_start::content: st_ = state::content; drop_leading_ = true; break;
    case stream_start::content_continuation: st_ = state::content; break;
    case stream_start::reasoning: st_ = state::reasoning; drop_leading_ = true; break;
    case stream_start::reasoning_continuation: st_ = state::reasoning; break;
    case stream_start::tool_calls: st_ = state::block; opt_.parse_tool_calls = true; break;
  }
  if (opt_.start != stream_start::content && opt_.start != stream_start::tool_calls)
    usage_.reasoning_tokens = 0;  // thinking mode: reasoning tokens are reported
}

void stream_parser::emit(stream_event::kind k, std::string_view s, std::vector<stream_event>& out,
                         int index) {
  if (s.empty() && mergeable(k)) return;
  if (mergeable(k) && !out.empty() && out.back().type == k && out.back().index == index) {
    out.back().text.append(s);
  } else {
    stream_event e;
    e.type = k;
    e.text.assign(s);
    e.index = index;
    out.push_back(std::move(e));
  }
  if (k == stream_event::kind::text && !content_ids_.empty()) {
    auto& ids = out.back().tokens;
    ids.insert(ids.end(), content_ids_.begin(), content_ids_.end());
    content_ids_.clear();
  }
}

void stream_parser::content_in(std::size_t n) {
  if (n == 0) return;
  if (!content_src_.empty() && content_src_.back().first == token_) content_src_.back().second += n;
  else content_src_.emplace_back(token_, n);
}

void stream_parser::content_out(std::size_t n) {
  while (n > 0 && !content_src_.empty()) {
    auto& [id, bytes] = content_src_.front();
    if (static_cast<std::int64_t>(id) > content_listed_) {
      content_ids_.push_back(id);
      content_listed_ = id;
    }
    const std::size_t take = std::min(n, bytes);
    bytes -= take;
    n -= take;
    if (bytes == 0) content_src_.pop_front();
  }
}

void stream_parser::content_drop(std::size_t n) {
  while (n > 0 && !content_src_.empty()) {
    auto& bytes = content_src_.back().second;
    const std::size_t take = std::min(n, bytes);
    bytes -= take;
    n -= take;
    if (bytes == 0) content_src_.pop_back();
  }
}

void stream_parser::flush_utf8(std::vector<stream_event>& out) {
  if (utf8_.empty()) return;
  const std::string s = utf8_sanitize(utf8_);
  if (utf8_kind_ == stream_event::kind::text) content_out(utf8_.size());
  utf8_.clear();
  if (utf8_kind_ == stream_event::kind::arguments && value_is_string_) {
    std::string esc;
    json_escape(s, esc);
    emit(utf8_kind_, esc, out, call_index_);
  } else {
    emit(utf8_kind_, s, out, utf8_kind_ == stream_event::kind::arguments ? call_index_ : 0);
  }
}

// Text bytes of one stream (content, reasoning or an argument value): emitted once they form
// complete UTF-8 characters; argument values of string parameters are JSON-escaped.
void stream_parser::emit_text(stream_event::kind k, std::string_view bytes,
                              std::vector<stream_event>& out) {
  if (bytes.empty()) return;
  if (k != utf8_kind_) {
    flush_utf8(out);
    utf8_kind_ = k;
  }
  if (k == stream_event::kind::reasoning) token_put_ = true;
  utf8_.append(bytes);
  const std::size_t keep = incomplete_tail(utf8_);
  if (keep == utf8_.size()) return;
  const std::string_view ready(utf8_.data(), utf8_.size() - keep);
  const std::string s = utf8_sanitize(ready);
  if (k == stream_event::kind::text) content_out(ready.size());
  const int index = k == stream_event::kind::arguments ? call_index_ : 0;
  if (k == stream_event::kind::arguments && value_is_string_) {
    std::string esc;
    json_escape(s, esc);
    emit(k, esc, out, index);
  } else {
    emit(k, s, out, index);
  }
  utf8_.erase(0, utf8_.size() - keep);
}

// Answer text: checked against the stop sequences. A suffix that could still grow into one is
// held; a complete one ends the output there (the text before it is emitted, finish `stop`).
void stream_parser::emit_content(std::string_view bytes, std::vector<stream_event>& out) {
  if (opt_.stop.empty()) {
    emit_text(stream_event::kind::text, bytes, out);
    return;
  }
  stop_buf_.append(bytes);
  std::size_t first = std::string::npos;
  for (const auto& stop : opt_.stop)
    if (!stop.empty()) first = std::min(first, stop_buf_.find(stop));
  if (first != std::string::npos) {
    for (const auto& stop : opt_.stop)  // the first listed of those that end at `first`
      if (!stop.empty() && stop_buf_.compare(first, stop.size(), stop) == 0) {
        stop_sequence_ = stop;
        break;
      }
    emit_text(stream_event::kind::text, std::string_view(stop_buf_).substr(0, first), out);
    content_drop(stop_buf_.size() - first + hold_.size());
    stop_buf_.clear();
    hold_.clear();
    flush_utf8(out);
    stopped_ = ended_ = true;
    st_ = state::after_block;
    return;
  }
  std::size_t keep = 0;  // the longest suffix that is a proper prefix of a stop sequence
  for (const auto& stop : opt_.stop)
    for (std::size_t n = std::min(stop.size() - 1, stop_buf_.size()); n > keep; --n)
      if (stop_buf_.compare(stop_buf_.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
  emit_text(stream_event::kind::text, std::string_view(stop_buf_).substr(0, stop_buf_.size() - keep), out);
  stop_buf_.erase(0, stop_buf_.size() - keep);
}

void stream_parser::release_hold(std::vector<stream_event>& out) {
  if (hold_.empty()) return;
  const std::string h = std::move(hold_);
  hold_.clear();
  switch (st_) {
    case state::reasoning:
      emit_text(stream_event::kind::reasoning, h, out);
      *usage_.reasoning_tokens += held_tokens_;
      held_tokens_ = 0;
      break;
    case state::value: emit_text(stream_event::kind::arguments, h, out); break;
    default: emit_content(h, out); break;
  }
}

void stream_parser::on_byte(char b, std::vector<stream_event>& out) {
  if (stopped_) return;
  switch (st_) {
    case state::reasoning:
      if (drop_leading_) {
        if (b == '\n') return;
        drop_leading_ = false;
      }
      if (b == '\n') {
        hold_ += b;
        token_held_ = true;
        return;
      }
      release_hold(out);
      emit_text(stream_event::kind::reasoning, std::string_view(&b, 1), out);
      return;
    case state::content:
      if (drop_leading_) {
        if (b == '\n') return;
        drop_leading_ = false;
      }
      content_in(1);
      if (opt_.parse_tool_calls) {
        const bool has_lt = !hold_.empty() && hold_.back() == '<';
        if ((b == '\n' || b == '<') && !has_lt) {
          hold_ += b;
          return;
        }
        release_hold(out);
        if (b == '\n' || b == '<') {
          hold_ += b;
          return;
        }
      }
      emit_content(std::string_view(&b, 1), out);
      return;
    case state::content_tag:
      if (b == '>') {
        end_tag(out);
        return;
      }
      tag_ += b;
      if (tag_.size() > k_max_tag) abort_content_tag(out);
      return;
    case state::block:
      if (b == '<') hold_ = "<";
      else if (b == '/' && hold_ == "<") hold_ = "</";
      else hold_.clear();
      return;
    case state::block_tag:
      if (b == '"') tag_in_quotes_ = !tag_in_quotes_;
      if (b == '>' && !tag_in_quotes_) {
        end_tag(out);
        return;
      }
      tag_ += b;
      if (tag_.size() > k_max_block_tag) {
        tag_.clear();
        st_ = state::block;
      }
      return;
    case state::value:
      if (hold_.empty() && b == '<') {
        hold_ = "<";
        return;
      }
      if (hold_ == "<" && b == '/') {
        hold_ = "</";
        return;
      }
      release_hold(out);
      if (b == '<') {
        hold_ = "<";
        return;
      }
      emit_text(stream_event::kind::arguments, std::string_view(&b, 1), out);
      return;
    case state::value_tag:
      if (b == '>') {
        end_tag(out);
        return;
      }
      tag_ += b;
      if (tag_.size() > k_max_tag) {
        st_ = state::value;
        const std::string t = "</" + std::string(k_dsml) + tag_;
        tag_.clear();
        emit_text(stream_event::kind::arguments, t, out);
      }
      return;
    case state::after_block: return;
  }
}

// A `<` + `｜DSML｜` + text in content that is not `tool_calls>`: it was text after all.
void stream_parser::abort_content_tag(std::vector<stream_event>& out) {
  st_ = state::content;
  const std::string rest = std::move(tag_);
  tag_.clear();
  release_hold(out);
  content_in(1 + k_dsml.size());
  emit_content("<" + std::string(k_dsml), out);
  for (const char c : rest) on_byte(c, out);
}

void stream_parser::end_tag(std::vector<stream_event>& out) {
  using k = stream_event::kind;
  std::string tag;
  tag.swap(tag_);
  tag_in_quotes_ = false;
  if (st_ == state::content_tag) {
    if (tag == "tool_calls") {
      content_drop(hold_.size());
      hold_.clear();  // newlines before the block are trimmed
      flush_utf8(out);
      st_ = state::block;
    } else {
      tag_ = tag + ">";
      abort_content_tag(out);
    }
    return;
  }
  if (st_ == state::value_tag) {
    if (tag == "parameter") {
      flush_utf8(out);
      if (value_is_string_) emit(k::arguments, "\"", out, call_index_);
      st_ = state::block;
    } else {
      st_ = state::value;
      emit_text(k::arguments, "</" + std::string(k_dsml) + tag + ">", out);
    }
    return;
  }
  // block_tag
  st_ = state::block;
  const std::string_view word = first_word(tag);
  const bool open_call = call_index_ >= 0;
  if (tag_closing_) {
    if (word == "invoke" && open_call) {
      emit(k::arguments, call_has_args_ ? "}" : "{}", out, call_index_);
      call_index_ = -1;
    } else if (word == "tool_calls") {
      st_ = state::after_block;
    }
    return;
  }
  if (word == "invoke") {
    if (open_call) emit(k::arguments, call_has_args_ ? "}" : "{}", out, call_index_);
    call_index_ = calls_++;
    call_has_args_ = false;
    stream_event e;
    e.type = k::tool_call;
    e.index = call_index_;
    e.text = attribute(tag, "name").value_or("");
    out.push_back(std::move(e));
  } else if (word == "parameter" && open_call) {
    const std::string key = attribute(tag, "name").value_or("");
    value_is_string_ = attribute(tag, "string").value_or("true") != "false";
    std::string a = call_has_args_ ? ", \"" : "{\"";
    json_escape(key, a);
    a += value_is_string_ ? "\": \"" : "\": ";
    emit(k::arguments, a, out, call_index_);
    call_has_args_ = true;
    st_ = state::value;
  }
}

void stream_parser::on_dsml(std::vector<stream_event>& out) {
  switch (st_) {
    case state::content:
      if (opt_.parse_tool_calls && !hold_.empty() && hold_.back() == '<') {
        hold_.pop_back();
        content_drop(1);
        st_ = state::content_tag;
        return;
      }
      release_hold(out);
      content_in(k_dsml.size());
      emit_content(k_dsml, out);
      return;
    case state::content_tag:
      abort_content_tag(out);
      on_dsml(out);
      return;
    case state::reasoning:
      release_hold(out);
      emit_text(stream_event::kind::reasoning, k_dsml, out);
      return;
    case state::block:
      if (hold_ == "<" || hold_ == "</") {
        tag_closing_ = hold_ == "</";
        tag_.clear();
        st_ = state::block_tag;
      }
      hold_.clear();
      return;
    case state::block_tag:  // a new tag before `>`: the unfinished one is dropped
      tag_.clear();
      tag_in_quotes_ = false;
      return;
    case state::value:
      if (hold_ == "</") {
        hold_.clear();
        tag_.clear();
        st_ = state::value_tag;
        return;
      }
      release_hold(out);
      emit_text(stream_event::kind::arguments, k_dsml, out);
      return;
    case state::value_tag: {
      const std::string t = "</" + std::string(k_dsml) + tag_;
      tag_.clear();
      st_ = state::value;
      emit_text(stream_event::kind::arguments, t, out);
      on_dsml(out);
      return;
    }
    case state::after_block: return;
  }
}

void stream_parser::push(token_id id, std::vector<stream_event>& out) {
  if (ended_ || finished_) return;  // after the end of sentence, a stop sequence or finish()
  token_ = static_cast<std::uint32_t>(usage_.completion_tokens++);
  if (id == eos_) {
    end_of_output(out);
    ended_ = true;
    return;
  }
  if (id == end_think_) {
    if (st_ == state::reasoning) {
      hold_.clear();  // newlines before </think> are trimmed
      held_tokens_ = 0;
      flush_utf8(out);
      st_ = state::content;
      drop_leading_ = true;
    }
    return;  // elsewhere a stray </think> is dropped, as the reference does
  }
  if (id == think_) return;  // never part of the output
  const bool in_reasoning = st_ == state::reasoning;
  token_put_ = token_held_ = false;
  if (id == dsml_) {
    on_dsml(out);
  } else {
    const std::string bytes = tok_->decode_bytes(std::span<const token_id>(&id, 1));
    for (const char c : bytes) on_byte(c, out);
  }
  if (in_reasoning && usage_.reasoning_tokens) {
    if (token_put_) ++*usage_.reasoning_tokens;
    else if (token_held_) ++held_tokens_;
  }
}

void stream_parser::push(std::span<const token_id> ids, std::vector<stream_event>& out) {
  for (const token_id id : ids) push(id, out);
}

void stream_parser::end_of_output(std::vector<stream_event>& out) {
  switch (st_) {
    case state::reasoning:
    case state::content:
    case state::value: release_hold(out); break;
    case state::content_tag: abort_content_tag(out); release_hold(out); break;
    case state::value_tag: {
      const std::string t = "</" + std::string(k_dsml) + tag_;
      tag_.clear();
      st_ = state::value;
      emit_text(stream_event::kind::arguments, t, out);
      break;
    }
    default: break;
  }
  hold_.clear();
  if (!stop_buf_.empty()) {  // a beginning of a stop sequence that did not complete
    emit_text(stream_event::kind::text, stop_buf_, out);
    stop_buf_.clear();
  }
  flush_utf8(out);
  st_ = state::after_block;
}

void stream_parser::finish(backend_finish why, std::vector<stream_event>& out) {
  if (finished_) return;
  if (!ended_) end_of_output(out);
  finished_ = true;
  stream_event f;
  f.type = stream_event::kind::finish;
  if (stopped_) {  // the output ended at a stop sequence
    why = backend_finish::stop;
    f.text = stop_sequence_;
  }
  switch (why) {
    case backend_finish::length: f.finish = finish_reason::length; break;
    case backend_finish::content_filter: f.finish = finish_reason::content_filter; break;
    case backend_finish::stop:
      f.finish = calls_ > 0 ? finish_reason::tool_calls : finish_reason::stop;
      break;
  }
  out.push_back(std::move(f));
  stream_event u;
  u.type = stream_event::kind::usage;
  u.usage = usage_;
  out.push_back(std::move(u));
}

// ---------------------------------------------------------------------------------------------
// chat_chunk_renderer

namespace {
std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::string json_quoted(std::string_view s) {
  std::string out = "\"";
  json_escape(s, out);
  out += '"';
  return out;
}
}  // namespace

std::uint64_t tool_call_id_seed(std::string_view response_id) {
  std::uint64_t rng = 0xC0FFEEULL;
  for (const char c : response_id) rng = rng * 131 + static_cast<unsigned char>(c);
  return rng;
}

std::string next_tool_call_id(std::uint64_t& rng, int index) {
  static constexpr std::string_view alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::array<char, 8> idx{};
  std::snprintf(idx.data(), idx.size(), "%02d", index);
  std::string id = std::string("call_") + idx.data() + "_";
  for (int i = 0; i < 24; ++i) id += alnum[splitmix(rng) % alnum.size()];
  return id;
}

chat_chunk_renderer::chat_chunk_renderer(chat_chunk_options options) : opt_(std::move(options)) {
  rng_ = tool_call_id_seed(opt_.id);
}

std::string chat_chunk_renderer::chunk(const std::string& delta_json, const char* finish,
                                       const std::string* usage, const std::string* logprobs) const {
  std::string s = "{\"id\":" + json_quoted(opt_.id) + ",\"object\":\"chat.completion.chunk\",\"created\":"
                  + std::to_string(opt_.created) + ",\"model\":" + json_quoted(opt_.model)
                  + ",\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"delta\":" + delta_json
                  + ",\"logprobs\":"
                  + (logprobs ? "{\"content\":" + *logprobs + ",\"refusal\":null}" : std::string("null"))
                  + ",\"finish_reason\":"
                  + (finish ? json_quoted(finish) : std::string("null")) + "}]";
  if (usage) s += ",\"usage\":" + *usage;
  else if (opt_.include_usage) s += ",\"usage\":null";
  s += '}';
  return s;
}

std::string chat_chunk_renderer::start() {
  return chunk(!opt_.thinking ? R"({"role":"assistant","content":""})"
               : opt_.starts_in_reasoning ? R"({"role":"assistant","content":null,"reasoning_content":""})"
                                          : R"({"role":"assistant","content":"","reasoning_content":null})",
               nullptr, nullptr);
}

void chat_chunk_renderer::render(std::span<const stream_event> events, std::vector<std::string>& out) {
  using k = stream_event::kind;
  for (const stream_event& e : events) {
    switch (e.type) {
      case k::text: {
        const std::string logprobs = opt_.logprobs ? opt_.logprobs(e) : std::string();
        out.push_back(chunk("{\"content\":" + json_quoted(e.text)
                                + (opt_.thinking ? ",\"reasoning_content\":null}" : "}"),
                            nullptr, nullptr, opt_.logprobs ? &logprobs : nullptr));
        break;
      }
      case k::reasoning:
        out.push_back(chunk("{\"content\":null,\"reasoning_content\":" + json_quoted(e.text) + "}",
                            nullptr, nullptr));
        break;
      case k::tool_call: {
        std::string id;
        if (opt_.tool_call_id) {
          id = opt_.tool_call_id(e.index);
        } else {
          id = next_tool_call_id(rng_, e.index);
        }
        out.push_back(chunk("{\"tool_calls\":[{\"index\":" + std::to_string(e.index) + ",\"id\":"
                                + json_quoted(id) + ",\"type\":\"function\",\"function\":{\"name\":"
                                + json_quoted(e.text) + ",\"arguments\":\"\"}}]}",
                            nullptr, nullptr));
        break;
      }
      case k::arguments:
        out.push_back(chunk("{\"tool_calls\":[{\"index\":" + std::to_string(e.index)
                                + ",\"function\":{\"arguments\":" + json_quoted(e.text) + "}}]}",
                            nullptr, nullptr));
        break;
      case k::finish: finish_ = e.finish; break;
      case k::usage: {
        const usage_counts& u = e.usage;
        std::string us = "{\"prompt_tokens\":" + std::to_string(u.prompt_tokens)
                         + ",\"completion_tokens\":" + std::to_string(u.completion_tokens)
                         + ",\"total_tokens\":" + std::to_string(u.prompt_tokens + u.completion_tokens)
                         + ",\"prompt_tokens_details\":{\"cached_tokens\":"
                         + std::to_string(u.cached_prompt_tokens) + "}";
        if (opt_.thinking)
          us += ",\"completion_tokens_details\":{\"reasoning_tokens\":"
                + std::to_string(u.reasoning_tokens.value_or(0)) + "}";
        us += ",\"prompt_cache_hit_tokens\":" + std::to_string(u.cached_prompt_tokens)
              + ",\"prompt_cache_miss_tokens\":"
              + std::to_string(u.prompt_tokens - u.cached_prompt_tokens) + "}";
        const std::string fin(to_string(finish_.value_or(finish_reason::stop)));
        out.push_back(chunk(opt_.thinking ? R"({"content":"","reasoning_content":null})"
                                          : R"({"content":""})",
                            fin.c_str(), &us));
        finish_.reset();
        break;
      }
    }
  }
}

}  // namespace troupe::recipe

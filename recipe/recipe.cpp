#include "recipe/recipe.hpp"

#include <exception>

namespace troupe::recipe {

struct codec::state {
  recipe::tokenizer tok;
  codec_options options;
  std::unique_ptr<thread_pool> pool;  // threads > 1
};

std::optional<protocol> protocol_from_name(std::string_view name) {
  if (name == "chat" || name == "chat_completions") return protocol::chat_completions;
  if (name == "responses") return protocol::responses;
  if (name == "messages") return protocol::messages;
  return std::nullopt;
}

std::string_view to_string(protocol p) {
  switch (p) {
    case protocol::chat_completions: return "chat_completions";
    case protocol::responses: return "responses";
    case protocol::messages: return "messages";
  }
  return "chat_completions";
}

std::string error_json(protocol p, const api_error& e) {
  return p == protocol::messages ? e.to_anthropic_json() : e.to_json();
}

namespace {
bool starts_in_reasoning(const stream_options& o) {
  return o.start == stream_start::reasoning || o.start == stream_start::reasoning_continuation;
}

std::variant<chat_chunk_renderer, responses_event_renderer, messages_event_renderer> make_renderer(
    const encoded_request& r, event_stream_options o) {
  if (o.model.empty()) o.model = r.params.model;
  if (o.prompt_tokens == 0) {
    o.prompt_tokens = r.stream.prompt_tokens;
    o.cached_prompt_tokens = r.stream.cached_prompt_tokens;
  }
  switch (r.protocol) {
    case protocol::responses:
      return responses_event_renderer(std::move(o), r.params, r.responses);
    case protocol::messages: {
      const bool thinking = starts_in_reasoning(r.stream);
      return messages_event_renderer(std::move(o), thinking);
    }
    case protocol::chat_completions: break;
  }
  chat_chunk_options co;
  co.id = std::move(o.id);
  co.model = std::move(o.model);
  co.created = o.created;
  co.thinking = r.stream.start != stream_start::content && r.stream.start != stream_start::tool_calls;
  co.starts_in_reasoning = starts_in_reasoning(r.stream);
  co.include_usage = r.params.include_usage;
  co.tool_call_id = std::move(o.tool_call_id);
  co.logprobs = std::move(o.logprobs);
  return chat_chunk_renderer(std::move(co));
}
}  // namespace

stream_renderer::stream_renderer(const encoded_request& r, event_stream_options o)
    : r_(make_renderer(r, std::move(o))) {}

void stream_renderer::start(std::vector<std::string>& out) {
  if (auto* c = std::get_if<chat_chunk_renderer>(&r_)) out.push_back(c->start());
  else if (auto* rr = std::get_if<responses_event_renderer>(&r_)) rr->start(out);
  else std::get<messages_event_renderer>(r_).start(out);
}

void stream_renderer::render(std::span<const stream_event> events, std::vector<std::string>& out) {
  std::visit([&](auto& r) { r.render(events, out); }, r_);
}

std::string stream_renderer::error(const api_error& e) {
  if (std::holds_alternative<chat_chunk_renderer>(r_)) return e.to_json();
  if (auto* rr = std::get_if<responses_event_renderer>(&r_)) return rr->error(e);
  return messages_event_renderer::error(e);
}

stream_options stream_options_for(const conversation& c, std::uint64_t prompt_tokens) {
  stream_options o;
  o.prompt_tokens = prompt_tokens;
  const bool tools_on = !c.tools.empty() && c.tool_choice != tool_choice::none;
  o.parse_tool_calls = tools_on;
  const bool prefix = !c.messages.empty() && c.messages.back().role == role::assistant
                      && c.messages.back().prefix;
  if (prefix) {
    const auto& m = c.messages.back();
    o.start = c.thinking && m.reasoning && m.content.empty() ? stream_start::reasoning_continuation
            : c.thinking ? stream_start::content_continuation : stream_start::content;
  } else if (tools_on && c.tool_choice == tool_choice::required) {
    o.start = stream_start::tool_calls;
  } else {
    o.start = c.thinking ? stream_start::reasoning : stream_start::content;
  }
  return o;
}

std::variant<codec, load_error> codec::load(const std::filesystem::path& file, codec_options options) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    return load_error{"tokenizer file not found: " + file.string()};
  try {
    auto s = std::make_unique<state>(state{recipe::tokenizer::from_file(file), options, nullptr});
    // The prompt encoder and the stream parser need their control tokens: check them now, so that
    // encode and create_stream_parser cannot fail later.
    if (auto m = missing_control_token(s->tok, prompt_format::v4))
      return load_error{file.string() + ": the tokenizer has no token " + *m};
    if (auto p = stream_parser::create(s->tok, {}); std::holds_alternative<std::string>(p))
      return load_error{file.string() + ": " + std::get<std::string>(p)};
    if (options.threads > 1) s->pool = std::make_unique<thread_pool>(options.threads);
    return codec(std::move(s));
  } catch (const std::exception& e) {
    return load_error{file.string() + ": " + e.what()};
  }
}

std::variant<codec, load_error> codec::from_json(std::string_view json, codec_options options) {
  try {
    auto s = std::make_unique<state>(state{recipe::tokenizer::from_json(json), options, nullptr});
    if (auto m = missing_control_token(s->tok, prompt_format::v4))
      return load_error{"tokenizer.json: the tokenizer has no token " + *m};
    if (auto p = stream_parser::create(s->tok, {}); std::holds_alternative<std::string>(p))
      return load_error{std::get<std::string>(p)};
    if (options.threads > 1) s->pool = std::make_unique<thread_pool>(options.threads);
    return codec(std::move(s));
  } catch (const std::exception& e) {
    return load_error{std::string("tokenizer.json: ") + e.what()};
  }
}

codec::codec(std::unique_ptr<state> s) : s_(std::move(s)) {}
codec::codec(codec&&) noexcept = default;
codec& codec::operator=(codec&&) noexcept = default;
codec::~codec() = default;

const tokenizer& codec::tokenizer() const { return s_->tok; }

std::vector<token_id> codec::stop_ids() const {
  // The stream parser's control tokens were checked at load, the end of sentence among them.
  return {*s_->tok.token_to_id("<｜end▁of▁sentence｜>")};
}

std::vector<token_id> codec::tokenize(std::string_view text, encode_mode mode) const {
  if (s_->pool) return encode_parallel(s_->tok, text, mode, *s_->pool, s_->options.parallel);
  return s_->tok.encode(text, mode);
}

std::string codec::detokenize(std::span<const token_id> ids, bool skip_special) const {
  return s_->tok.decode(ids, skip_special);
}

encoded_prompt codec::encode(const conversation& c) const {
  if (s_->pool) return encode_prompt(c, s_->tok, *s_->pool, s_->options.parallel);
  return encode_prompt(c, s_->tok);
}

std::variant<encoded_request, api_error> codec::encode(protocol p, std::string_view body) const {
  encoded_request out;
  out.protocol = p;
  switch (p) {
    case protocol::chat_completions: {
      auto parsed = parse_chat_completions(body, s_->options.chat);
      if (auto* e = std::get_if<api_error>(&parsed)) return std::move(*e);
      auto& req = std::get<chat_completions_request>(parsed);
      out.conversation = std::move(req.conversation);
      out.params = std::move(req.params);
      break;
    }
    case protocol::responses: {
      auto parsed = parse_responses(body, s_->options.chat);
      if (auto* e = std::get_if<api_error>(&parsed)) return std::move(*e);
      auto& req = std::get<responses_request>(parsed);
      out.conversation = std::move(req.conversation);
      out.params = std::move(req.params);
      out.responses = std::move(req.fields);
      break;
    }
    case protocol::messages: {
      auto parsed = parse_messages(body, s_->options.chat);
      if (auto* e = std::get_if<api_error>(&parsed)) return std::move(*e);
      auto& req = std::get<messages_request>(parsed);
      out.conversation = std::move(req.conversation);
      out.params = std::move(req.params);
      break;
    }
  }
  out.prompt = encode(out.conversation);
  out.stream = stream_options_for(out.conversation, out.prompt.ids.size());
  out.stream.stop = out.params.stop;
  return out;
}

stream_parser codec::create_stream_parser(const stream_options& o) const {
  return std::get<stream_parser>(stream_parser::create(s_->tok, o));  // checked at load
}

stream_parser codec::create_stream_parser(const encoded_request& r) const {
  return create_stream_parser(r.stream);
}

}  // namespace troupe::recipe

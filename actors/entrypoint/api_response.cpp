// One generation's HTTP body in its API's shape (see api_response.hpp).
#include "actors/entrypoint/api_response.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace troupe::actors {

namespace {

// The `type` of an event object: the renderers write it first, so a prefix check suffices;
// anything else is parsed properly.
std::string event_type(std::string_view json) {
  constexpr std::string_view prefix = "{\"type\":\"";
  if (json.starts_with(prefix)) {
    const auto end = json.find('"', prefix.size());
    if (end != std::string_view::npos)
      return std::string(json.substr(prefix.size(), end - prefix.size()));
  }
  try {
    const auto j = nlohmann::json::parse(json);
    if (j.is_object() && j.contains("type") && j["type"].is_string())
      return j["type"].get<std::string>();
  } catch (const std::exception&) {
  }
  return "message";
}

using ojson = nlohmann::ordered_json;

/// One logprobs entry: the token's text, its log-probability and its bytes.
ojson logprob_entry(const recipe::tokenizer& tok, std::int32_t id, float logprob) {
  const std::vector<recipe::token_id> one{static_cast<recipe::token_id>(id)};
  const std::string raw = tok.decode_bytes(one);
  ojson bytes = ojson::array();
  for (unsigned char c : raw)
    bytes.push_back(static_cast<int>(c));
  return ojson{{"token", tok.decode(one)}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

/// The entries of the generated ids at positions `ids` (with their top alternatives); a
/// position without logprobs is left out.
ojson logprob_entries(const recipe::tokenizer& tok,
                      const std::vector<runtime::sampled_token>& logprobs,
                      std::span<const std::uint32_t> ids) {
  auto out = ojson::array();
  for (const auto i : ids) {
    if (i >= logprobs.size())
      continue;
    const auto& t = logprobs[i];
    auto e = logprob_entry(tok, t.token, t.logprob);
    auto top = ojson::array();
    for (const auto& [id, lp] : t.top)
      top.push_back(logprob_entry(tok, id, lp));
    e["top_logprobs"] = std::move(top);
    out.push_back(std::move(e));
  }
  return out;
}

recipe::backend_finish to_backend(finish_reason r) {
  return r == finish_reason::length ? recipe::backend_finish::length
                                    : recipe::backend_finish::stop;
}

} // namespace

std::string sse_frame(recipe::protocol p, std::string_view json) {
  std::string out;
  out.reserve(json.size() + 40);
  if (p != recipe::protocol::chat_completions) {
    out += "event: ";
    out += event_type(json);
    out += '\n';
  }
  out += "data: ";
  out += json;
  out += "\n\n";
  return out;
}

api_response::api_response(const recipe::codec& codec, recipe::encoded_request request,
                           std::string id, std::int64_t created,
                           std::vector<recipe::token_id> stop_ids)
  : codec_(&codec),
    logprobs_(std::make_shared<std::vector<runtime::sampled_token>>()),
    request_(std::move(request)),
    id_(std::move(id)),
    created_(created),
    stop_ids_(std::move(stop_ids)),
    parser_(codec.create_stream_parser(request_)),
    tool_rng_(recipe::tool_call_id_seed(id_)) {
  switch (request_.protocol) {
    case recipe::protocol::chat_completions:
      logprobs_on_ = request_.params.logprobs;
      break;
    case recipe::protocol::responses:
      logprobs_on_ = request_.responses.output_text_logprobs;
      break;
    case recipe::protocol::messages:
      break;
  }
  if (streaming()) {
    recipe::event_stream_options o;
    o.id = id_;
    o.created = created_;
    if (logprobs_on_)
      o.logprobs = [tok = &codec.tokenizer(), logprobs = logprobs_](const recipe::stream_event& e) {
        return logprob_entries(*tok, *logprobs, e.tokens).dump();
      };
    renderer_.emplace(request_, std::move(o));
  } else {
    // Thinking mode reports a reasoning field even when it stays empty (as the stream does).
    const auto start = request_.stream.start;
    if (start != recipe::stream_start::content && start != recipe::stream_start::tool_calls)
      result_.reasoning = std::string{};
  }
}

std::string api_response::frames(const std::vector<std::string>& objects) const {
  std::string out;
  for (const auto& o : objects)
    out += sse_frame(request_.protocol, o);
  return out;
}

std::string api_response::open() {
  if (!renderer_)
    return {};
  std::vector<std::string> objects;
  renderer_->start(objects);
  return frames(objects);
}

std::string api_response::push(std::span<const std::int32_t> tokens) {
  std::vector<recipe::stream_event> events;
  for (const std::int32_t t : tokens) {
    const auto id = static_cast<recipe::token_id>(t);
    ++pushed_;
    last_ = id;
    parser_.push(id, events);
  }
  if (!renderer_) {
    accumulate(events);
    return {};
  }
  std::vector<std::string> objects;
  renderer_->render(events, objects);
  return frames(objects);
}

bool api_response::wants_cancel() const noexcept {
  if (!parser_.ended() || finished_)
    return false;
  if (parser_.stopped_by_sequence())
    return true;
  // Ended on the end of sentence: the graph stops by itself when that was its last token.
  return std::find(stop_ids_.begin(), stop_ids_.end(), last_) == stop_ids_.end();
}

void api_response::accumulate(const std::vector<recipe::stream_event>& events) {
  using kind = recipe::stream_event::kind;
  for (const auto& e : events) {
    switch (e.type) {
      case kind::text:
        result_.content += e.text;
        answer_ids_.insert(answer_ids_.end(), e.tokens.begin(), e.tokens.end());
        break;
      case kind::reasoning:
        if (!result_.reasoning)
          result_.reasoning = std::string{};
        *result_.reasoning += e.text;
        break;
      case kind::tool_call: {
        if (e.index < 0)
          break;
        const auto index = static_cast<std::size_t>(e.index);
        if (result_.tool_calls.size() <= index)
          result_.tool_calls.resize(index + 1);
        auto& call = result_.tool_calls[index];
        call.name = e.text;
        call.id = recipe::next_tool_call_id(tool_rng_, e.index);
        break;
      }
      case kind::arguments: {
        if (e.index < 0)
          break;
        const auto index = static_cast<std::size_t>(e.index);
        if (result_.tool_calls.size() <= index)
          result_.tool_calls.resize(index + 1);
        result_.tool_calls[index].arguments += e.text;
        break;
      }
      case kind::finish:
        result_.finish = e.finish == recipe::finish_reason::length ? recipe::backend_finish::length
                         : e.finish == recipe::finish_reason::content_filter
                           ? recipe::backend_finish::content_filter
                           : recipe::backend_finish::stop;
        if (!e.text.empty())
          result_.stop_sequence = e.text;
        break;
      case kind::usage:
        result_.reasoning_tokens =
          static_cast<std::int64_t>(e.usage.reasoning_tokens.value_or(0));
        break;
    }
  }
}

void api_response::push_logprobs(std::span<const runtime::sampled_token> logprobs) {
  if (logprobs_on_)
    logprobs_->insert(logprobs_->end(), logprobs.begin(), logprobs.end());
}

std::string api_response::with_logprobs(std::string response) const {
  if (!logprobs_on_)
    return response;
  auto doc = ojson::parse(response, nullptr, false);
  if (doc.is_discarded())
    return response;
  auto entries = logprob_entries(codec_->tokenizer(), *logprobs_, answer_ids_);
  if (request_.protocol == recipe::protocol::chat_completions) {
    if (!doc.contains("choices") || doc["choices"].empty())
      return response;
    doc["choices"][0]["logprobs"] = {{"content", std::move(entries)}, {"refusal", nullptr}};
  } else {
    // Responses: the message item's output_text part.
    for (auto& item : doc["output"])
      if (item.value("type", "") == "message")
        for (auto& part : item["content"])
          if (part.value("type", "") == "output_text")
            part["logprobs"] = entries;
  }
  return doc.dump();
}

std::string api_response::finish(const generation_end& end) {
  if (finished_)
    return {};
  std::vector<recipe::stream_event> events;
  parser_.finish(to_backend(end.reason), events);
  finished_ = true;
  // The graph's counts are the truth (it generated them, stop-string tail included).
  recipe::usage_counts usage = parser_.usage();
  if (end.prompt_tokens > 0)
    usage.prompt_tokens = end.prompt_tokens;
  usage.cached_prompt_tokens = end.cached_tokens;
  usage.completion_tokens = end.completion_tokens;
  for (auto& e : events)
    if (e.type == recipe::stream_event::kind::usage)
      e.usage = usage;
  if (renderer_) {
    std::vector<std::string> objects;
    renderer_->render(events, objects);
    std::string out = frames(objects);
    if (request_.protocol == recipe::protocol::chat_completions)
      out += "data: [DONE]\n\n";
    return out;
  }
  accumulate(events);
  for (auto& call : result_.tool_calls)  // a call whose arguments never came is `{}`
    if (call.arguments.empty())
      call.arguments = "{}";
  result_.completion_tokens = static_cast<std::int64_t>(usage.completion_tokens);
  recipe::response_meta meta;
  meta.id = id_;
  meta.model = request_.params.model;
  meta.created = created_;
  meta.prompt_tokens = static_cast<std::int64_t>(usage.prompt_tokens);
  meta.cached_tokens = static_cast<std::int64_t>(usage.cached_prompt_tokens);
  switch (request_.protocol) {
    case recipe::protocol::chat_completions:
      return with_logprobs(recipe::render_chat_completion({&result_, 1}, meta));
    case recipe::protocol::responses: {
      recipe::responses_request echo;
      echo.params = request_.params;
      echo.fields = request_.responses;
      return with_logprobs(recipe::render_response(result_, meta, echo));
    }
    case recipe::protocol::messages:
      return recipe::render_message(result_, meta);
  }
  return {};
}

std::string api_response::error(const recipe::api_error& e) {
  if (!renderer_)
    return recipe::error_json(request_.protocol, e);
  return sse_frame(request_.protocol, renderer_->error(e));
}

} // namespace troupe::actors

// Neutral stream events -> Responses and Messages streaming events (recipe/stream_events.hpp).
#include "recipe/stream_events.hpp"

#include "recipe/results.hpp"

#include <nlohmann/json.hpp>

namespace troupe::recipe {
namespace {
using ojson = nlohmann::ordered_json;

// An event object: "type" first, then the fields in the order given (the reference's order).
ojson event(const char* type) {
  ojson e;
  e["type"] = type;
  return e;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Responses

responses_event_renderer::responses_event_renderer(event_stream_options options, const responses_request& request)
    : responses_event_renderer(std::move(options), request.params, request.fields) {}

responses_event_renderer::responses_event_renderer(event_stream_options options, sampling_params params,
                                                   responses_fields fields)
    : opt_(std::move(options)), rng_(tool_call_id_seed(opt_.id)) {
  echo_.params = std::move(params);
  echo_.fields = std::move(fields);
}

std::string responses_event_renderer::next_id_for_call(int index) {
  return opt_.tool_call_id ? opt_.tool_call_id(index) : next_tool_call_id(rng_, index);
}

std::string responses_event_renderer::response_object(const char* status, bool final_usage) const {
  generation g;
  g.finish = !finish_ || *finish_ == finish_reason::stop || *finish_ == finish_reason::tool_calls
                 ? backend_finish::stop
             : *finish_ == finish_reason::length ? backend_finish::length
                                                 : backend_finish::content_filter;
  g.completion_tokens = static_cast<std::int64_t>(usage_.completion_tokens);
  g.reasoning_tokens = static_cast<std::int64_t>(usage_.reasoning_tokens.value_or(0));
  response_meta meta{opt_.id, opt_.model, opt_.created, static_cast<std::int64_t>(opt_.prompt_tokens),
                     static_cast<std::int64_t>(opt_.cached_prompt_tokens)};
  if (final_usage) {
    meta.prompt_tokens = static_cast<std::int64_t>(usage_.prompt_tokens);
    meta.cached_tokens = static_cast<std::int64_t>(usage_.cached_prompt_tokens);
  }
  ojson r = ojson::parse(render_response(g, meta, echo_));
  r["status"] = status;
  ojson output = ojson::array();
  for (const auto& item : done_items_) output.push_back(ojson::parse(item));
  r["output"] = std::move(output);
  if (!final_usage) {
    r["completed_at"] = nullptr;
    r["incomplete_details"] = nullptr;
    r.erase("usage");  // not known yet; the spec allows no null here (the reference writes null)
  }
  return r.dump();
}

void responses_event_renderer::start(std::vector<std::string>& out) {
  for (const char* type : {"response.created", "response.in_progress"}) {
    ojson e = event(type);
    e["response"] = ojson::parse(response_object("in_progress", false));
    e["sequence_number"] = seq_++;
    out.push_back(e.dump());
  }
}

void responses_event_renderer::open(item kind, const stream_event& ev, std::vector<std::string>& out) {
  const std::size_t index = done_items_.size();
  const std::string n = std::to_string(index);
  ojson it;
  ojson part;
  if (kind == item::reasoning) {
    item_id_ = "rs_" + opt_.id + "_" + n;
    it = {{"type", "reasoning"}, {"id", item_id_}, {"status", "in_progress"}, {"content", ojson::array()},
          {"summary", ojson::array()}, {"encrypted_content", opt_.id + "-" + n}};
    part = {{"type", "reasoning_text"}, {"text", ""}};
  } else if (kind == item::message) {
    item_id_ = "msg_" + opt_.id + "_" + n;
    it = {{"type", "message"}, {"id", item_id_}, {"status", "in_progress"}, {"role", "assistant"},
          {"phase", "final_answer"}, {"content", ojson::array()}};
    part = {{"type", "output_text"}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}, {"text", ""}};
  } else {
    item_id_ = "fc_" + opt_.id + "_" + n;
    call_id_ = next_id_for_call(ev.index);
    call_name_ = ev.text;
    it = {{"type", "function_call"}, {"id", item_id_}, {"status", "in_progress"}, {"call_id", call_id_},
          {"name", call_name_}, {"arguments", ""}};
  }
  ojson e = event("response.output_item.added");
  e["item"] = std::move(it);
  e["output_index"] = index;
  e["sequence_number"] = seq_++;
  out.push_back(e.dump());
  if (kind != item::call) {
    ojson p = event("response.content_part.added");
    p["content_index"] = 0;
    p["item_id"] = item_id_;
    p["output_index"] = index;
    p["part"] = std::move(part);
    p["sequence_number"] = seq_++;
    out.push_back(p.dump());
  }
  cur_ = kind;
  text_.clear();
  logprobs_.clear();
}

void responses_event_renderer::close(bool complete, bool call_follows, std::vector<std::string>& out) {
  if (cur_ == item::none) return;
  const std::size_t index = done_items_.size();
  const char* status = complete ? "completed" : "incomplete";
  ojson it;
  if (cur_ == item::call) {
    ojson d = event("response.function_call_arguments.done");
    d["arguments"] = text_;
    d["item_id"] = item_id_;
    d["name"] = call_name_;  // required by the spec (the reference leaves it out)
    d["output_index"] = index;
    d["sequence_number"] = seq_++;
    out.push_back(d.dump());
    it = {{"type", "function_call"}, {"id", item_id_}, {"status", status}, {"call_id", call_id_},
          {"name", call_name_}, {"arguments", text_}};
  } else {
    const bool reasoning = cur_ == item::reasoning;
    ojson logprobs = ojson::array();
    for (const auto& l : logprobs_)
      for (auto& entry : ojson::parse(l)) logprobs.push_back(std::move(entry));
    ojson part = reasoning ? ojson{{"type", "reasoning_text"}, {"text", text_}}
                           : ojson{{"type", "output_text"}, {"annotations", ojson::array()},
                                   {"logprobs", logprobs}, {"text", text_}};
    ojson d = event(reasoning ? "response.reasoning_text.done" : "response.output_text.done");
    d["content_index"] = 0;
    d["item_id"] = item_id_;
    if (!reasoning) d["logprobs"] = std::move(logprobs);
    d["output_index"] = index;
    d["sequence_number"] = seq_++;
    d["text"] = text_;
    out.push_back(d.dump());
    ojson p = event("response.content_part.done");
    p["content_index"] = 0;
    p["item_id"] = item_id_;
    p["output_index"] = index;
    p["part"] = part;
    p["sequence_number"] = seq_++;
    out.push_back(p.dump());
    if (reasoning)
      it = {{"type", "reasoning"}, {"id", item_id_}, {"status", status}, {"content", ojson::array({part})},
            {"summary", ojson::array()}, {"encrypted_content", opt_.id + "-" + std::to_string(index)}};
    else
      it = {{"type", "message"}, {"id", item_id_}, {"status", status}, {"role", "assistant"},
            {"phase", call_follows ? "commentary" : "final_answer"}, {"content", ojson::array({part})}};
  }
  ojson e = event("response.output_item.done");
  e["item"] = it;
  e["output_index"] = index;
  e["sequence_number"] = seq_++;
  out.push_back(e.dump());
  done_items_.push_back(it.dump());
  cur_ = item::none;
}

void responses_event_renderer::render(std::span<const stream_event> events, std::vector<std::string>& out) {
  using k = stream_event::kind;
  for (const stream_event& ev : events) {
    switch (ev.type) {
      case k::reasoning:
      case k::text: {
        const item want = ev.type == k::reasoning ? item::reasoning : item::message;
        if (cur_ != want) {
          close(true, false, out);
          open(want, ev, out);
        }
        ojson d = event(want == item::reasoning ? "response.reasoning_text.delta" : "response.output_text.delta");
        d["content_index"] = 0;
        d["delta"] = ev.text;
        d["item_id"] = item_id_;
        if (want == item::message) {
          d["logprobs"] = ojson::array();
          if (opt_.logprobs) {
            logprobs_.push_back(opt_.logprobs(ev));
            d["logprobs"] = ojson::parse(logprobs_.back());
          }
        }
        d["output_index"] = done_items_.size();
        d["sequence_number"] = seq_++;
        out.push_back(d.dump());
        text_ += ev.text;
        break;
      }
      case k::tool_call:
        close(true, true, out);
        open(item::call, ev, out);
        break;
      case k::arguments: {
        if (cur_ != item::call) break;  // the parser sends arguments only inside a call
        ojson d = event("response.function_call_arguments.delta");
        d["delta"] = ev.text;
        d["item_id"] = item_id_;
        d["output_index"] = done_items_.size();
        d["sequence_number"] = seq_++;
        out.push_back(d.dump());
        text_ += ev.text;
        break;
      }
      case k::finish:
        finish_ = ev.finish;
        close(ev.finish == finish_reason::stop || ev.finish == finish_reason::tool_calls, false, out);
        break;
      case k::usage: {
        usage_ = ev.usage;
        const bool complete = !finish_ || *finish_ == finish_reason::stop || *finish_ == finish_reason::tool_calls;
        ojson e = event(complete ? "response.completed" : "response.incomplete");
        e["response"] = ojson::parse(response_object(complete ? "completed" : "incomplete", true));
        e["sequence_number"] = seq_++;
        out.push_back(e.dump());
        break;
      }
    }
  }
}

std::string responses_event_renderer::error(const api_error& err) {
  ojson e = event("error");
  e["code"] = err.code ? ojson(*err.code) : ojson(nullptr);
  e["message"] = err.message;
  e["param"] = err.param ? ojson(*err.param) : ojson(nullptr);
  e["sequence_number"] = seq_++;
  return e.dump();
}

// ---------------------------------------------------------------------------------------------
// Messages

messages_event_renderer::messages_event_renderer(event_stream_options options, bool thinking)
    : opt_(std::move(options)), thinking_(thinking), rng_(tool_call_id_seed(opt_.id)) {}

std::string messages_event_renderer::usage_json(std::uint64_t output_tokens) const {
  ojson u = {{"input_tokens", opt_.prompt_tokens - opt_.cached_prompt_tokens},
             {"cache_creation_input_tokens", 0},
             {"cache_read_input_tokens", opt_.cached_prompt_tokens},
             {"output_tokens", output_tokens},
             {"service_tier", "standard"}};
  return u.dump();
}

void messages_event_renderer::start(std::vector<std::string>& out) {
  ojson m = {{"id", opt_.id}, {"type", "message"}, {"role", "assistant"}, {"model", opt_.model},
             {"content", ojson::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
             {"usage", ojson::parse(usage_json(0))}};
  ojson e = event("message_start");
  e["message"] = std::move(m);
  out.push_back(e.dump());
}

void messages_event_renderer::open(block kind, const stream_event* ev, std::vector<std::string>& out) {
  close(out);
  ojson b;
  if (kind == block::thinking) {
    b = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
    thinking_opened_ = true;
  } else if (kind == block::text) {
    b = {{"type", "text"}, {"text", ""}};
  } else {
    b = {{"type", "tool_use"},
         {"id", opt_.tool_call_id ? opt_.tool_call_id(ev->index) : next_tool_call_id(rng_, ev->index)},
         {"name", ev->text},
         {"input", ojson::object()}};
  }
  ojson e = event("content_block_start");
  e["index"] = ++index_;
  e["content_block"] = std::move(b);
  out.push_back(e.dump());
  if (!pinged_) {
    out.push_back(event("ping").dump());
    pinged_ = true;
  }
  cur_ = kind;
}

void messages_event_renderer::close(std::vector<std::string>& out) {
  if (cur_ == block::none) return;
  if (cur_ == block::thinking) {
    ojson e = event("content_block_delta");
    e["index"] = index_;
    e["delta"] = {{"type", "signature_delta"}, {"signature", opt_.id}};
    out.push_back(e.dump());
  }
  ojson e = event("content_block_stop");
  e["index"] = index_;
  out.push_back(e.dump());
  cur_ = block::none;
}

void messages_event_renderer::render(std::span<const stream_event> events, std::vector<std::string>& out) {
  using k = stream_event::kind;
  for (const stream_event& ev : events) {
    // In thinking mode the thinking block comes first, even when empty (also for an empty reply).
    if (thinking_ && !thinking_opened_ && ev.type != k::arguments && ev.type != k::usage)
      open(block::thinking, nullptr, out);
    switch (ev.type) {
      case k::reasoning:
      case k::text: {
        const block want = ev.type == k::reasoning ? block::thinking : block::text;
        if (cur_ != want) open(want, nullptr, out);
        ojson e = event("content_block_delta");
        e["index"] = index_;
        e["delta"] = want == block::thinking ? ojson{{"type", "thinking_delta"}, {"thinking", ev.text}}
                                             : ojson{{"type", "text_delta"}, {"text", ev.text}};
        out.push_back(e.dump());
        break;
      }
      case k::tool_call: open(block::tool_use, &ev, out); break;
      case k::arguments: {
        if (cur_ != block::tool_use) break;
        ojson e = event("content_block_delta");
        e["index"] = index_;
        e["delta"] = {{"type", "input_json_delta"}, {"partial_json", ev.text}};
        out.push_back(e.dump());
        break;
      }
      case k::finish:
        finish_ = ev.finish;
        stop_sequence_ = ev.text;
        close(out);
        break;
      case k::usage: {
        const finish_reason f = finish_.value_or(finish_reason::stop);
        const bool by_stop_sequence = f == finish_reason::stop && !stop_sequence_.empty();
        const char* reason = f == finish_reason::length           ? "max_tokens"
                             : f == finish_reason::content_filter ? "refusal"
                             : f == finish_reason::tool_calls     ? "tool_use"
                             : by_stop_sequence                   ? "stop_sequence"
                                                                  : "end_turn";
        opt_.prompt_tokens = ev.usage.prompt_tokens;
        opt_.cached_prompt_tokens = ev.usage.cached_prompt_tokens;
        ojson e = event("message_delta");
        e["delta"] = {{"stop_reason", reason},
                      {"stop_sequence", by_stop_sequence ? ojson(stop_sequence_) : ojson(nullptr)}};
        e["usage"] = ojson::parse(usage_json(ev.usage.completion_tokens));
        out.push_back(e.dump());
        out.push_back(event("message_stop").dump());
        break;
      }
    }
  }
}

std::string messages_event_renderer::error(const api_error& e) { return e.to_anthropic_json(); }

}  // namespace troupe::recipe

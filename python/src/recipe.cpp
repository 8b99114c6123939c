// The recipe in troupe._core: tokenizer, request conversion, prompt encoding, stream parsing and
// the protocols' stream events. troupe.recipe (python/troupe/recipe.py) builds the public,
// deepseek_recipe-shaped API on these; the GIL is released around tokenization, prompt encoding
// and parsing, so Python threads can encode in parallel.
#include "bindings.hpp"

#include "recipe/parallel.hpp"
#include "recipe/recipe.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace troupe::python {

namespace {

namespace r = troupe::recipe;

r::encode_mode parse_mode(const std::string& m) {
  if (m == "plain") return r::encode_mode::plain;
  if (m == "trusted") return r::encode_mode::trusted;
  if (m == "raw") return r::encode_mode::raw;
  throw nb::value_error("mode must be 'plain', 'trusted' or 'raw'");
}

r::prompt_format parse_format(const std::string& f) {
  if (f == "v4") return r::prompt_format::v4;
  if (f == "v41") return r::prompt_format::v41;
  throw nb::value_error("format must be 'v4' or 'v41'");
}

// A str (UTF-8) or bytes (invalid UTF-8 is replaced by U+FFFD when encoded).
std::string text_of(nb::handle h) {
  if (nb::isinstance<nb::str>(h)) {
    Py_ssize_t size = 0;
    const char* s = PyUnicode_AsUTF8AndSize(h.ptr(), &size);
    if (!s) throw nb::python_error();
    return std::string(s, static_cast<std::size_t>(size));
  }
  if (nb::isinstance<nb::bytes>(h)) {
    auto b = nb::borrow<nb::bytes>(h);
    return std::string(b.c_str(), b.size());
  }
  throw nb::type_error("expected str or bytes");
}

unsigned resolve_threads(unsigned threads) {
  return threads ? threads : std::max(1u, std::thread::hardware_concurrency());
}

// A loaded tokenizer, shared by what is made from it (stream parsers and detokenizers keep a
// pointer to it).
struct tokenizer_ref {
  std::shared_ptr<const r::tokenizer> tok;
};

struct detokenizer {
  std::shared_ptr<const r::tokenizer> tok;
  r::incremental_detokenizer d;
};

// A request converted from its protocol; the prompt is encoded separately.
struct request {
  r::encoded_request r;
};

struct error_info {
  int status = 400;
  std::string message, type;
  std::optional<std::string> param, code;
  std::string body;  // the protocol's error object, JSON
};

struct parser {
  std::shared_ptr<const r::tokenizer> tok;
  r::stream_parser p;
};

std::string_view start_name(r::stream_start s) {
  switch (s) {
    case r::stream_start::content: return "content";
    case r::stream_start::content_continuation: return "content_continuation";
    case r::stream_start::reasoning: return "reasoning";
    case r::stream_start::reasoning_continuation: return "reasoning_continuation";
    case r::stream_start::tool_calls: return "tool_calls";
  }
  return "content";
}

r::stream_start parse_start(const std::string& s) {
  for (auto v : {r::stream_start::content, r::stream_start::content_continuation,
                 r::stream_start::reasoning, r::stream_start::reasoning_continuation,
                 r::stream_start::tool_calls})
    if (s == start_name(v)) return v;
  throw nb::value_error("start must be 'content', 'content_continuation', 'reasoning', "
                        "'reasoning_continuation' or 'tool_calls'");
}

r::backend_finish parse_finish(const std::string& s) {
  if (s == "stop") return r::backend_finish::stop;
  if (s == "length") return r::backend_finish::length;
  if (s == "content_filter") return r::backend_finish::content_filter;
  throw nb::value_error("finish must be 'stop', 'length' or 'content_filter'");
}

std::string_view kind_name(r::stream_event::kind k) {
  using k_t = r::stream_event::kind;
  switch (k) {
    case k_t::text: return "text";
    case k_t::reasoning: return "reasoning";
    case k_t::tool_call: return "tool_call";
    case k_t::arguments: return "arguments";
    case k_t::finish: return "finish";
    case k_t::usage: return "usage";
  }
  return "text";
}

nb::dict usage_dict(const r::usage_counts& u) {
  nb::dict d;
  d["prompt_tokens"] = u.prompt_tokens;
  d["cached_prompt_tokens"] = u.cached_prompt_tokens;
  d["completion_tokens"] = u.completion_tokens;
  d["reasoning_tokens"] = u.reasoning_tokens ? nb::cast(*u.reasoning_tokens) : nb::none();
  return d;
}

// An event as the dict `troupe parse-stream --neutral` prints (plus `tokens` for text).
nb::dict event_dict(const r::stream_event& e) {
  using k = r::stream_event::kind;
  nb::dict d;
  d["type"] = kind_name(e.type);
  switch (e.type) {
    case k::text:
      d["text"] = e.text;
      d["tokens"] = e.tokens;
      break;
    case k::reasoning: d["text"] = e.text; break;
    case k::tool_call:
      d["index"] = e.index;
      d["name"] = e.text;
      break;
    case k::arguments:
      d["index"] = e.index;
      d["text"] = e.text;
      break;
    case k::finish:
      d["reason"] = r::to_string(e.finish);
      if (!e.text.empty()) d["stop_sequence"] = e.text;
      break;
    case k::usage: {
      d["prompt_tokens"] = e.usage.prompt_tokens;
      d["completion_tokens"] = e.usage.completion_tokens;
      if (e.usage.cached_prompt_tokens) d["cached_prompt_tokens"] = e.usage.cached_prompt_tokens;
      if (e.usage.reasoning_tokens) d["reasoning_tokens"] = *e.usage.reasoning_tokens;
      break;
    }
  }
  return d;
}

nb::list events_list(const std::vector<r::stream_event>& events) {
  nb::list l;
  for (const auto& e : events) l.append(event_dict(e));
  return l;
}

template <class T>
nb::object opt(const std::optional<T>& v) {
  return v ? nb::cast(*v) : nb::none();
}

std::string_view role_name(r::role x) {
  switch (x) {
    case r::role::system: return "system";
    case r::role::user: return "user";
    case r::role::assistant: return "assistant";
    case r::role::tool: return "tool";
  }
  return "user";
}

std::string_view effort_name(r::reasoning_effort e) {
  switch (e) {
    case r::reasoning_effort::low: return "low";
    case r::reasoning_effort::high: return "high";
    case r::reasoning_effort::xhigh: return "xhigh";
    case r::reasoning_effort::max: return "max";
  }
  return "high";
}

nb::dict conversation_dict(const r::conversation& c) {
  nb::list messages;
  for (const auto& m : c.messages) {
    nb::dict d;
    d["role"] = role_name(m.role);
    d["content"] = m.content;
    d["reasoning_content"] = opt(m.reasoning);
    nb::list calls;
    for (const auto& t : m.tool_calls) {
      nb::dict call;
      call["id"] = t.id;
      call["name"] = t.name;
      call["arguments"] = t.arguments;
      calls.append(call);
    }
    d["tool_calls"] = calls;
    d["tool_call_id"] = m.tool_call_id;
    d["prefix"] = m.prefix;
    d["images"] = m.images;
    messages.append(d);
  }
  nb::list tools;
  for (const auto& t : c.tools) {
    nb::dict d;
    d["name"] = t.name;
    d["description"] = opt(t.description);
    d["parameters"] = t.parameters_json;
    tools.append(d);
  }
  nb::dict format;
  using fk = r::response_format::kind;
  format["type"] = c.format.type == fk::json_object   ? "json_object"
                   : c.format.type == fk::json_schema ? "json_schema"
                   : c.format.type == fk::regex       ? "regex"
                   : c.format.type == fk::grammar     ? "grammar"
                                                      : "text";
  if (c.format.type == fk::json_schema) format["schema"] = c.format.schema_json;
  if (c.format.type == fk::regex) format["regex"] = c.format.regex;
  if (c.format.type == fk::grammar) format["grammar"] = c.format.grammar;
  nb::dict d;
  d["messages"] = messages;
  d["tools"] = tools;
  d["tool_choice"] = c.tool_choice == r::tool_choice::none       ? "none"
                     : c.tool_choice == r::tool_choice::required ? "required"
                                                                 : "auto";
  d["thinking"] = c.thinking;
  d["reasoning_effort"] = c.effort ? nb::cast(std::string(effort_name(*c.effort))) : nb::none();
  d["effort_level"] = opt(c.effort_level);
  d["response_format"] = format;
  return d;
}

nb::dict params_dict(const r::sampling_params& p) {
  nb::dict d;
  d["model"] = p.model;
  d["max_tokens"] = opt(p.max_tokens);
  d["temperature"] = opt(p.temperature);
  d["top_p"] = opt(p.top_p);
  d["n"] = p.n;
  d["stop"] = p.stop;
  d["stream"] = p.stream;
  d["include_usage"] = p.include_usage;
  d["logprobs"] = p.logprobs;
  d["top_logprobs"] = opt(p.top_logprobs);
  d["top_k"] = opt(p.top_k);
  d["seed"] = opt(p.seed);
  d["presence_penalty"] = opt(p.presence_penalty);
  d["frequency_penalty"] = opt(p.frequency_penalty);
  d["response_format"] = p.response_format_type;
  d["response_format_json"] = opt(p.response_format_json);
  d["reasoning_effort"] = opt(p.reasoning_effort);
  d["tool_choice_function"] = opt(p.tool_choice_function);
  d["image_parts"] = p.image_parts;
  return d;
}

// Byte offset -> code point offset (a Python str index) in valid UTF-8 `s`, for sorted offsets.
std::vector<std::pair<std::size_t, std::size_t>> to_code_points(
    const std::string& s, const std::vector<std::pair<std::size_t, std::size_t>>& ranges) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  out.reserve(ranges.size());
  std::size_t byte = 0, cp = 0;
  auto advance = [&](std::size_t to) {
    for (; byte < to && byte < s.size(); ++byte)
      if ((static_cast<unsigned char>(s[byte]) & 0xC0) != 0x80) ++cp;
    return cp;
  };
  for (const auto& [a, b] : ranges) {
    const std::size_t ca = advance(a);
    out.emplace_back(ca, advance(b));
  }
  return out;
}

std::variant<request, error_info> convert(const std::string& protocol_name, nb::handle body_h,
                                          bool default_thinking,
                                          std::vector<std::string> models,
                                          std::vector<std::string> v41_models,
                                          std::int64_t max_tokens_limit, int max_n,
                                          bool reject_images) {
  const auto p = r::protocol_from_name(protocol_name);
  if (!p) throw nb::value_error("protocol must be 'chat_completions', 'responses' or 'messages'");
  const std::string body = text_of(body_h);
  r::chat_completions_config cfg;
  cfg.default_thinking = default_thinking;
  cfg.models = std::move(models);
  cfg.v41_models = std::move(v41_models);
  cfg.max_tokens_limit = max_tokens_limit;
  cfg.max_n = max_n;
  cfg.images = reject_images ? r::image_policy::reject : r::image_policy::placeholder;
  nb::gil_scoped_release nogil;
  request out;
  out.r.protocol = *p;
  auto fail = [&](const r::api_error& e) {
    return error_info{e.status, e.message, e.type, e.param, e.code, r::error_json(*p, e)};
  };
  switch (*p) {
    case r::protocol::chat_completions: {
      auto parsed = r::parse_chat_completions(body, cfg);
      if (auto* e = std::get_if<r::api_error>(&parsed)) return fail(*e);
      auto& req = std::get<r::chat_completions_request>(parsed);
      out.r.conversation = std::move(req.conversation);
      out.r.params = std::move(req.params);
      break;
    }
    case r::protocol::responses: {
      auto parsed = r::parse_responses(body, cfg);
      if (auto* e = std::get_if<r::api_error>(&parsed)) return fail(*e);
      auto& req = std::get<r::responses_request>(parsed);
      out.r.conversation = std::move(req.conversation);
      out.r.params = std::move(req.params);
      out.r.responses = std::move(req.fields);
      break;
    }
    case r::protocol::messages: {
      auto parsed = r::parse_messages(body, cfg);
      if (auto* e = std::get_if<r::api_error>(&parsed)) return fail(*e);
      auto& req = std::get<r::messages_request>(parsed);
      out.r.conversation = std::move(req.conversation);
      out.r.params = std::move(req.params);
      break;
    }
  }
  // As codec::encode: where the output starts and what is parsed follow the conversation; the
  // prompt's length is set when the stream is opened.
  out.r.stream = r::stream_options_for(out.r.conversation, 0);
  out.r.stream.stop = out.r.params.stop;
  return out;
}

// The stream parser for what the model generates after `req`'s prompt, or with explicit options.
parser make_parser(const tokenizer_ref& t, r::stream_options o) {
  auto created = r::stream_parser::create(*t.tok, std::move(o));
  if (auto* e = std::get_if<std::string>(&created)) throw nb::value_error(e->c_str());
  return parser{t.tok, std::move(std::get<r::stream_parser>(created))};
}

// A request's stream: parser + the protocol's renderer, as `troupe parse-stream` drives them.
struct event_stream {
  std::shared_ptr<const r::tokenizer> tok;  // the parser's
  r::stream_parser p;
  r::stream_renderer render;

  std::vector<std::string> push(const std::vector<r::token_id>& ids) {
    std::vector<r::stream_event> events;
    std::vector<std::string> out;
    for (const auto id : ids) {
      p.push(id, events);
      render.render(events, out);
      events.clear();
    }
    return out;
  }
};

}  // namespace

void bind_recipe(nb::module_& m) {
  nb::class_<tokenizer_ref>(m, "Tokenizer",
                            "A byte-level BPE tokenizer read from a Hugging Face tokenizer.json")
      .def_static(
          "from_file",
          [](const std::string& path) {
            return tokenizer_ref{std::make_shared<const r::tokenizer>(r::tokenizer::from_file(path))};
          },
          "path"_a, "Loads a tokenizer.json, or a gzip-compressed one when the name ends in .gz.")
      .def_static(
          "from_str",
          [](const std::string& json) {
            return tokenizer_ref{std::make_shared<const r::tokenizer>(r::tokenizer::from_json(json))};
          },
          "json"_a, "Loads a tokenizer from the text of a tokenizer.json.")
      .def(
          "encode",
          [](const tokenizer_ref& t, nb::handle text, const std::string& mode) {
            const auto m = parse_mode(mode);
            std::string s = text_of(text);
            nb::gil_scoped_release nogil;
            return t.tok->encode(s, m);
          },
          "text"_a, "mode"_a = "trusted")
      .def(
          "encode_batch",
          [](const tokenizer_ref& t, nb::iterable texts, const std::string& mode, unsigned threads) {
            const auto m = parse_mode(mode);
            std::vector<std::string> in;
            for (nb::handle h : texts) in.push_back(text_of(h));
            std::vector<std::vector<r::token_id>> out(in.size());
            {
              nb::gil_scoped_release nogil;
              const unsigned n = std::min<std::size_t>(resolve_threads(threads), std::max<std::size_t>(1, in.size()));
              r::thread_pool pool(n);
              pool.parallel_for(in.size(), [&](std::size_t i) { t.tok->encode(in[i], m, out[i]); });
            }
            return out;
          },
          "texts"_a, "mode"_a = "trusted", "threads"_a = 0)
      .def(
          "decode",
          [](const tokenizer_ref& t, const std::vector<r::token_id>& ids, bool skip) {
            nb::gil_scoped_release nogil;
            return t.tok->decode(ids, skip);
          },
          "ids"_a, "skip_special_tokens"_a = false)
      .def(
          "decode_bytes",
          [](const tokenizer_ref& t, const std::vector<r::token_id>& ids, bool skip) {
            std::string s;
            {
              nb::gil_scoped_release nogil;
              s = t.tok->decode_bytes(ids, skip);
            }
            return nb::bytes(s.data(), s.size());
          },
          "ids"_a, "skip_special_tokens"_a = false)
      .def_prop_ro("vocab_size", [](const tokenizer_ref& t) { return t.tok->vocab_size(); })
      .def("token_to_id", [](const tokenizer_ref& t, const std::string& token) { return t.tok->token_to_id(token); },
           "token"_a)
      .def("is_special", [](const tokenizer_ref& t, r::token_id id) { return t.tok->is_special(id); }, "id"_a);

  nb::class_<detokenizer>(m, "Detokenizer")
      .def(
          "__init__",
          [](detokenizer* self, const tokenizer_ref& t, bool skip) {
            new (self) detokenizer{t.tok, r::incremental_detokenizer(*t.tok, skip)};
          },
          "tokenizer"_a, "skip_special_tokens"_a = false)
      .def("push", [](detokenizer& d, const std::vector<r::token_id>& ids) { return d.d.push(ids); }, "ids"_a)
      .def("flush", [](detokenizer& d) { return d.d.flush(); })
      .def_prop_ro("pending_bytes", [](const detokenizer& d) { return d.d.pending_bytes(); });

  nb::class_<error_info>(m, "ApiError")
      .def_ro("status", &error_info::status)
      .def_ro("message", &error_info::message)
      .def_ro("type", &error_info::type)
      .def_ro("param", &error_info::param)
      .def_ro("code", &error_info::code)
      .def_ro("body", &error_info::body);

  nb::class_<request>(m, "Request")
      .def_prop_ro("protocol", [](const request& q) { return std::string(r::to_string(q.r.protocol)); })
      .def_prop_ro("model", [](const request& q) { return q.r.params.model; })
      .def_prop_ro("format", [](const request& q) {
        return q.r.params.format == r::prompt_format::v41 ? "v41" : "v4";
      })
      .def_prop_ro("params", [](const request& q) { return params_dict(q.r.params); })
      .def_prop_ro("conversation", [](const request& q) { return conversation_dict(q.r.conversation); })
      .def_prop_ro("stream_start", [](const request& q) { return std::string(start_name(q.r.stream.start)); })
      .def_prop_ro("parse_tool_calls", [](const request& q) { return q.r.stream.parse_tool_calls; })
      .def_prop_ro("stop", [](const request& q) { return q.r.stream.stop; });

  m.def("convert", &convert, "protocol"_a, "body"_a, "default_thinking"_a, "models"_a,
        "v41_models"_a, "max_tokens_limit"_a, "max_n"_a, "reject_images"_a,
        "A request body -> a Request, or the ApiError that rejects it.");

  m.def(
      "render_prompt",
      [](const request& q, const std::string& format) {
        const auto f = parse_format(format);
        r::rendered_prompt p;
        {
          nb::gil_scoped_release nogil;
          p = r::render_prompt(q.r.conversation, f);
        }
        return std::make_pair(p.text, to_code_points(p.text, p.control));
      },
      "request"_a, "format"_a,
      "The prompt text and the (start, end) code point ranges of its control tokens.");

  m.def(
      "encode_prompt",
      [](const request& q, const tokenizer_ref& t, const std::string& format, unsigned threads) {
        const auto f = parse_format(format);
        nb::gil_scoped_release nogil;
        if (auto missing = r::missing_control_token(*t.tok, f))
          throw std::runtime_error("the tokenizer has no token " + *missing + " of this prompt format");
        r::encoded_prompt p;
        if (threads != 1 && f == r::prompt_format::v4) {
          r::thread_pool pool(resolve_threads(threads));
          p = r::encode_prompt(q.r.conversation, *t.tok, pool);
        } else {
          p = r::encode_prompt(q.r.conversation, *t.tok, f);
        }
        return std::make_tuple(std::move(p.text), std::move(p.ids), std::move(p.control));
      },
      "request"_a, "tokenizer"_a, "format"_a, "threads"_a = 1,
      "The prompt text, its ids and the positions of the control ids.");

  nb::class_<parser>(m, "StreamParser")
      .def_static(
          "create",
          [](const tokenizer_ref& t, const std::string& start, bool parse_tool_calls,
             std::vector<std::string> stop, std::uint64_t prompt_tokens, std::uint64_t cached) {
            r::stream_options o;
            o.start = parse_start(start);
            o.parse_tool_calls = parse_tool_calls;
            o.stop = std::move(stop);
            o.prompt_tokens = prompt_tokens;
            o.cached_prompt_tokens = cached;
            return make_parser(t, std::move(o));
          },
          "tokenizer"_a, "start"_a, "parse_tool_calls"_a, "stop"_a, "prompt_tokens"_a,
          "cached_prompt_tokens"_a)
      .def_static(
          "for_request",
          [](const tokenizer_ref& t, const request& q, std::uint64_t prompt_tokens, std::uint64_t cached) {
            r::stream_options o = q.r.stream;
            o.prompt_tokens = prompt_tokens;
            o.cached_prompt_tokens = cached;
            return make_parser(t, std::move(o));
          },
          "tokenizer"_a, "request"_a, "prompt_tokens"_a, "cached_prompt_tokens"_a)
      .def(
          "push",
          [](parser& p, const std::vector<r::token_id>& ids) {
            std::vector<r::stream_event> events;
            {
              nb::gil_scoped_release nogil;
              p.p.push(ids, events);
            }
            return events_list(events);
          },
          "ids"_a)
      .def(
          "finish",
          [](parser& p, const std::string& why) {
            std::vector<r::stream_event> events;
            p.p.finish(parse_finish(why), events);
            return events_list(events);
          },
          "finish_reason"_a = "stop")
      .def_prop_ro("finished", [](const parser& p) { return p.p.finished(); })
      .def_prop_ro("ended", [](const parser& p) { return p.p.ended(); })
      .def_prop_ro("stopped_by_sequence", [](const parser& p) { return p.p.stopped_by_sequence(); })
      .def_prop_ro("usage", [](const parser& p) { return usage_dict(p.p.usage()); });

  nb::class_<event_stream>(m, "EventStream")
      .def(
          "__init__",
          [](event_stream* self, const tokenizer_ref& t, const request& q, const std::string& id,
             const std::string& model, std::int64_t created, std::uint64_t prompt_tokens,
             std::uint64_t cached, const std::string& start, bool parse_tool_calls,
             std::vector<std::string> stop) {
            // The request's parsing options, or the caller's (ParsingOptions in Python).
            r::encoded_request req = q.r;
            req.stream.start = parse_start(start);
            req.stream.parse_tool_calls = parse_tool_calls;
            req.stream.stop = std::move(stop);
            req.stream.prompt_tokens = prompt_tokens;
            req.stream.cached_prompt_tokens = cached;
            auto p = make_parser(t, req.stream);
            r::event_stream_options o;
            o.id = id;
            o.model = model;
            o.created = created;
            r::stream_renderer render(req, std::move(o));
            new (self) event_stream{t.tok, std::move(p.p), std::move(render)};
          },
          "tokenizer"_a, "request"_a, "id"_a, "model"_a, "created"_a, "prompt_tokens"_a,
          "cached_prompt_tokens"_a, "start"_a, "parse_tool_calls"_a, "stop"_a)
      .def("start",
           [](event_stream& s) {
             std::vector<std::string> out;
             s.render.start(out);
             return out;
           })
      .def(
          "push",
          [](event_stream& s, const std::vector<r::token_id>& ids) {
            nb::gil_scoped_release nogil;
            return s.push(ids);
          },
          "ids"_a, "Feeds ids one at a time; the protocol's events (JSON text) they confirm.")
      .def(
          "finish",
          [](event_stream& s, const std::string& why) {
            std::vector<r::stream_event> events;
            s.p.finish(parse_finish(why), events);
            std::vector<std::string> out;
            s.render.render(events, out);
            return out;
          },
          "finish_reason"_a = "stop")
      .def_prop_ro("finished", [](const event_stream& s) { return s.p.finished(); });
}

}  // namespace troupe::python

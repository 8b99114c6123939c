// The entrypoint's structured-output constraint table (structured_output.hpp).
#include "actors/entrypoint/structured_output.hpp"

#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/json_schema.hpp"
#include "recipe/grammar/lark.hpp"
#include "recipe/grammar/regex.hpp"
#include "recipe/grammar/structural_tag.hpp"
#include "recipe/grammar/tool_calls.hpp"

#include <nlohmann/json.hpp>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <charconv>

namespace troupe::actors {

namespace gr = recipe::grammar;

namespace {
/// Compiled grammars kept for reuse; past this the oldest key is dropped.
constexpr std::size_t cache_limit = 256;
// restore() replays at most this many output tokens on the caller's thread (an actor's: tens of
// µs); a longer output so far is replayed on a compile thread, as a compile is.
constexpr std::size_t inline_replay_limit = 256;
// A new grammar with at most this many frames a stack can wait in gets every frame's mask entry
// built on the warming thread after its compile (at most 4 MiB of masks), as XGrammar builds its
// masks; larger ones are warmed state by state after each accepted token.
constexpr std::size_t warm_all_frames = 256;
}  // namespace

constraint_table::constraint_table(const recipe::tokenizer& tok, unsigned compile_threads, bool warm_next)
    : vocab_(std::make_shared<const gr::vocabulary>(gr::vocabulary::from_tokenizer(tok))),
      think_end_(tok.token_to_id("</think>")),
      warm_next_(warm_next),
      tokens_(gr::names_of(vocab_, tok)),
      pool_(std::max(compile_threads, 1u)) {}

constraint_table::~constraint_table() {
  pool_.join();
  warm_pool_.join();
}

std::string constraint_table::format_key(const recipe::response_format& format) {
  using kind = recipe::response_format::kind;
  // JSON's spacing: `compact:`, or `whitespace:<length>:<pattern>`, before the JSON key
  const std::string spacing = format.whitespace_pattern
                                  ? "whitespace:" + std::to_string(format.whitespace_pattern->size()) + ":" +
                                        *format.whitespace_pattern
                                  : format.compact ? "compact:" : "";
  switch (format.type) {
    case kind::text: return {};
    case kind::json_object: return spacing + "object";
    case kind::json_schema: return spacing + "schema:" + format.schema_json;
    case kind::regex: return "regex:" + format.regex;
    case kind::structural_tag: return "structural_tag:" + format.structural_tag;
    case kind::grammar: {
      const bool lark = format.syntax == recipe::response_format::grammar_syntax::lark;
      return (lark ? "lark:" : "grammar:") + format.grammar;
    }
  }
  return {};
}

std::string constraint_table::tools_key(const recipe::conversation& c, recipe::prompt_format f,
                                        const std::string& content_key) {
  const bool on = !c.tools.empty() && c.tool_choice != recipe::tool_choice::none;
  const bool opened = c.tool_choice == recipe::tool_choice::required;
  const bool strict = std::any_of(c.tools.begin(), c.tools.end(),
                                  [](const recipe::tool_definition& t) { return t.strict_schema.has_value(); });
  if (!on || (!strict && !opened && !c.must_call && !c.one_call && content_key.empty()))
    return content_key;
  nlohmann::ordered_json j;
  j["v41"] = f == recipe::prompt_format::v41;
  j["mode"] = opened ? "opened" : c.must_call ? "forced" : "optional";
  j["one_call"] = c.one_call;
  j["content"] = opened || c.must_call ? std::string() : content_key;
  auto& tools = j["tools"] = nlohmann::ordered_json::array();
  for (const auto& t : c.tools)
    tools.push_back({{"name", t.name},
                     {"schema", t.strict_schema ? nlohmann::ordered_json::parse(*t.strict_schema)
                                                : nlohmann::ordered_json(nullptr)}});
  return "tools:" + j.dump();
}

namespace {

recipe::api_error bad_request(std::string message, std::string param) {
  return recipe::api_error{400, std::move(message), "invalid_request_error", std::move(param), std::nullopt};
}

/// The grammar of a key (constraint_table::format_key / tools_key); errors name `param`, or
/// `tool_params[i]` for tool i's schema.
std::variant<gr::grammar, recipe::api_error> grammar_of(std::string_view key, const std::string& param,
                                                        std::span<const std::string> tool_params,
                                                        const gr::token_names& tokens) {
  auto rest = [&](std::string_view prefix) -> std::optional<std::string_view> {
    if (!key.starts_with(prefix))
      return std::nullopt;
    return key.substr(prefix.size());
  };
  gr::json_style style;
  if (auto json = rest("compact:")) {  // JSON without whitespace: object or schema
    style.compact = true;
    key = *json;
  } else if (auto spaced = rest("whitespace:")) {  // <length>:<pattern>, then the JSON key
    std::size_t length = 0;
    const auto [end, ec] = std::from_chars(spaced->data(), spaced->data() + spaced->size(), length);
    const std::size_t at = static_cast<std::size_t>(end - spaced->data());
    if (ec != std::errc() || at >= spaced->size() || (*spaced)[at] != ':' || spaced->size() - at - 1 < length)
      return bad_request("not a structured-output format: a malformed whitespace key", param);
    auto ws = gr::whitespace_style(spaced->substr(at + 1, length));
    if (auto* e = std::get_if<std::string>(&ws))
      return bad_request("Invalid whitespace pattern for structured output: " + *e + ".", param);
    style = std::move(std::get<gr::json_style>(ws));
    key = spaced->substr(at + 1 + length);
  }
  if ((style.compact || style.whitespace) && key != "object" && !key.starts_with("schema:"))
    return bad_request("not a structured-output format: JSON spacing before a key that is not JSON", param);
  if (key == "object")
    return gr::any_json_object(style);
  if (auto schema = rest("schema:")) {
    auto r = gr::compile_json_schema(*schema, {}, style);
    if (auto* e = std::get_if<gr::schema_error>(&r))
      return bad_request("Unsupported JSON schema for structured output: " + e->to_string() + ".", param);
    return std::move(std::get<gr::grammar>(r));
  }
  if (auto lark = rest("lark:")) {
    auto r = gr::compile_lark(*lark);
    if (auto* e = std::get_if<gr::ebnf_error>(&r))
      return bad_request("Invalid Lark grammar for structured output: " + e->to_string() + ".", param);
    return std::move(std::get<gr::grammar>(r));
  }
  if (auto ebnf = rest("grammar:")) {
    auto r = gr::compile_ebnf(*ebnf);
    if (auto* e = std::get_if<gr::ebnf_error>(&r))
      return bad_request("Invalid grammar for structured output: " + e->to_string() + ".", param);
    return std::move(std::get<gr::grammar>(r));
  }
  if (auto tag = rest("structural_tag:")) {
    auto r = gr::compile_structural_tag(*tag, {}, &tokens);
    if (auto* e = std::get_if<gr::structural_tag_error>(&r))
      return bad_request("Invalid structural tag for structured output: " + e->to_string() + ".", param);
    return std::move(std::get<gr::grammar>(r));
  }
  if (auto pattern = rest("regex:")) {
    auto r = gr::compile_regex(*pattern);
    if (auto* e = std::get_if<gr::regex_error>(&r))
      return bad_request("Unsupported regex for structured output: " + e->message + " at offset "
                           + std::to_string(e->offset) + ".",
                         param);
    return std::move(std::get<gr::grammar>(r));
  }
  if (auto text = rest("tools:")) {
    const auto j = nlohmann::ordered_json::parse(*text, nullptr, false);
    auto parsed = j.is_discarded() ? std::nullopt : gr::tool_calls_spec_of(j);
    if (!parsed)
      return bad_request("not a structured-output format: a malformed tools key", "tools");
    gr::tool_calls_spec& spec = *parsed;
    std::optional<gr::grammar> content;
    if (const auto c = j.contains("content") && j["content"].is_string() ? j["content"].get<std::string>() : "";
        !c.empty()) {
      auto r = grammar_of(c, param, {}, tokens);
      if (auto* e = std::get_if<recipe::api_error>(&r))
        return *e;
      content = std::move(std::get<gr::grammar>(r));
      spec.content = &*content;
    }
    auto r = gr::compile_tool_calls(spec);
    if (auto* e = std::get_if<gr::tool_calls_error>(&r)) {
      const bool named = e->tool && *e->tool < tool_params.size();
      return bad_request("Unsupported JSON schema for a strict tool's parameters: " + e->error.to_string() + ".",
                         named ? tool_params[*e->tool] : "tools");
    }
    return std::move(std::get<gr::grammar>(r));
  }
  return bad_request("not a structured-output format: '" + std::string(key.substr(0, 40)) + "'", param);
}

}  // namespace

std::variant<std::shared_ptr<constraint_table::compiled>, recipe::api_error>
constraint_table::compile(const std::string& key, const std::string& param, std::span<const std::string> tool_params) {
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end())
      return it->second;
  }
  // Compiled outside the lock: the devices keep sampling meanwhile.
  auto g = grammar_of(key, param, tool_params, tokens_);
  if (auto* e = std::get_if<recipe::api_error>(&g))
    return *e;
  auto c = std::make_shared<compiled>();
  c->grammar = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(g)));
  c->masks = std::make_unique<gr::mask_computer>(c->grammar, vocab_);
  {  // the first mask, built here rather than while a device waits for it
    std::vector<std::uint32_t> first(vocab_->mask_words());
    c->masks->fill(gr::matcher(c->grammar), first);
  }
  std::lock_guard lock(mu_);
  if (auto it = cache_.find(key); it != cache_.end())
    return it->second;  // compiled meanwhile by another thread
  if (cache_.size() >= cache_limit)
    cache_.erase(cache_.begin());
  cache_.emplace(key, c);
  if (warm_next_)
    boost::asio::post(warm_pool_, [c] { c->masks->warm_all(warm_all_frames); });
  return c;
}

void constraint_table::add(std::uint64_t id, const std::string& key, bool thinking, const std::string& param,
                           std::span<const std::string> tool_params, verdict done) {
  if (key.empty()) {
    done(std::nullopt);
    return;
  }
  bool cached = false;
  {
    std::lock_guard lock(mu_);
    entry e;
    e.in_reasoning = thinking;
    if (auto it = cache_.find(key); it != cache_.end()) {
      e.c = it->second;
      e.m.emplace(e.c->grammar);
      cached = true;
    }
    entries_.insert_or_assign(id, std::make_shared<slot>(std::move(e)));
  }
  if (cached) {
    done(std::nullopt);
    return;
  }
  boost::asio::post(pool_, [this, id, key, param, tool_params = std::vector<std::string>(tool_params.begin(),
                                                                                          tool_params.end()),
                            done = std::move(done)] {
    auto c = compile(key, param, tool_params);
    auto* error = std::get_if<recipe::api_error>(&c);
    // The verdict first: the caller hears it before a device can sample under the grammar.
    done(error ? std::optional<recipe::api_error>(*error) : std::nullopt);
    std::lock_guard lock(mu_);
    if (auto it = entries_.find(id); it != entries_.end()) {
      std::lock_guard hold(it->second->mu);
      entry& e = it->second->e;
      if (error) {
        e.failed = true;
      } else {
        e.c = std::get<std::shared_ptr<compiled>>(c);
        e.m.emplace(e.c->grammar);
      }
    }
    compiled_.notify_all();
  });
}

std::variant<constraint_table::entry, std::string>
constraint_table::replayed(std::shared_ptr<compiled> c, const runtime::constraint_spec& spec,
                           std::span<const std::int32_t> context) {
  entry e;
  e.c = std::move(c);
  e.m.emplace(e.c->grammar);
  e.in_reasoning = spec.thinking;
  for (auto p = spec.output_start; p < context.size(); ++p) {
    if (!e.in_reasoning && !e.next)
      e.next = p;  // where allowed() would have started
    if (!accept_locked(e, p, context[p]))
      return "the output so far (token " + std::to_string(context[p]) + " at position " + std::to_string(p)
             + ") does not follow the format";
  }
  return e;
}

constraint_table::restore_result constraint_table::restore(std::uint64_t id, const runtime::constraint_spec& spec,
                                                           std::vector<std::int32_t> context, restored later) {
  std::shared_ptr<compiled> cached;
  if (context.size() <= spec.output_start + inline_replay_limit) {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(spec.format); it != cache_.end())
      cached = it->second;
  }
  if (cached) {
    auto r = replayed(std::move(cached), spec, context);
    if (auto* why = std::get_if<std::string>(&r))
      return {restore_result::refused, *why};
    std::lock_guard lock(mu_);
    entries_.insert_or_assign(id, std::make_shared<slot>(std::move(std::get<entry>(r))));
    return {};
  }
  // Until the compile (or the long replay) ends: free reasoning up to the first `</think>` (the context's, or one the
  // device draws meanwhile), and a device waiting in allowed() after it.
  entry pending;
  pending.in_reasoning = spec.thinking;
  for (auto p = spec.output_start; p < context.size() && pending.in_reasoning; ++p)
    pending.in_reasoning = !(think_end_ && static_cast<std::uint32_t>(context[p]) == *think_end_);
  std::uint64_t restore = 0;
  {
    std::lock_guard lock(mu_);
    pending.restore = restore = ++restores_;
    entries_.insert_or_assign(id, std::make_shared<slot>(std::move(pending)));
  }
  boost::asio::post(pool_, [this, id, restore, spec, context = std::move(context), later = std::move(later)] {
    auto c = compile(spec.format, "response_format", {});
    std::optional<std::string> why;
    std::optional<entry> rebuilt;
    if (auto* e = std::get_if<recipe::api_error>(&c)) {
      why = e->message;
    } else {
      auto r = replayed(std::get<std::shared_ptr<compiled>>(c), spec, context);
      if (auto* w = std::get_if<std::string>(&r))
        why = *w;
      else
        rebuilt = std::move(std::get<entry>(r));
    }
    // The verdict first: the caller hears it before a device can sample under the grammar.
    later(why);
    std::lock_guard lock(mu_);
    // (Not an entry that replaced it: the request's next job, after this one ended.)
    if (auto it = entries_.find(id); it != entries_.end() && it->second->e.restore == restore) {
      std::lock_guard hold(it->second->mu);
      entry& live = it->second->e;
      if (!rebuilt) {
        live.failed = true;
      } else {
        // The live entry kept the reasoning the device drew meanwhile; the constrained output
        // starts where the context's did.
        live.c = std::move(rebuilt->c);
        live.m = std::move(rebuilt->m);
        if (!rebuilt->in_reasoning)
          live.next = rebuilt->next;
      }
    }
    compiled_.notify_all();
  });
  return {restore_result::compiling, {}};
}

void constraint_table::remove(std::uint64_t id) {
  std::lock_guard lock(mu_);
  entries_.erase(id);
}

std::size_t constraint_table::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

void constraint_table::eos_only(std::span<std::uint32_t> mask) const {
  std::fill(mask.begin(), mask.end(), 0u);
  for (const auto id : vocab_->eos())
    if (id / 32 < mask.size())
      mask[id / 32] |= 1u << (id % 32);
}

bool constraint_table::allowed(std::uint64_t sequence, std::uint64_t position, std::span<std::uint32_t> mask) {
  std::shared_ptr<slot> s;
  {
    std::unique_lock lock(mu_);
    auto it = entries_.find(sequence);
    if (it == entries_.end())
      return false;
    {
      std::lock_guard hold(it->second->mu);
      if (it->second->e.in_reasoning)
        return false;
    }
    // Prefill ended before the compile did: wait for it here, in the device's thread. (c and
    // failed are only set with the table's lock held.)
    compiled_.wait(lock, [&] {
      it = entries_.find(sequence);
      return it == entries_.end() || it->second->e.c || it->second->e.failed;
    });
    if (it == entries_.end())
      return false;
    s = it->second;
  }
  // The mask is built under the entry's own lock: a state's first mask can take milliseconds,
  // and meanwhile other sequences' masks, add() and remove() go on.
  std::lock_guard hold(s->mu);
  entry& e = s->e;
  if (e.failed) {  // the request is being refused: end the output
    eos_only(mask);
    return true;
  }
  if (!e.next)
    e.next = position;
  if (position < *e.next && e.m->rollback(*e.next - position))  // a step drawn again
    e.next = position;
  if (position != *e.next) {  // tokens the table never saw: end the output
    eos_only(mask);
    return true;
  }
  thread_local std::vector<std::uint32_t> scratch;
  scratch.assign(vocab_->mask_words(), 0u);
  e.c->masks->fill(*e.m, scratch);
  std::fill(mask.begin(), mask.end(), 0u);
  std::copy_n(scratch.begin(), std::min(scratch.size(), mask.size()), mask.begin());
  if (std::all_of(mask.begin(), mask.end(), [](std::uint32_t w) { return w == 0; }))
    eos_only(mask);
  return true;
}

void constraint_table::accepted(std::uint64_t sequence, std::uint64_t position, std::int32_t token) {
  std::shared_ptr<slot> s;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(sequence);
    if (it == entries_.end())
      return;
    s = it->second;
  }
  std::lock_guard hold(s->mu);
  accept_locked(s->e, position, token);
  // A state not seen before: its mask's cached entries are built now, on the warming thread,
  // rather than when the device asks for the mask after its forward pass.
  const entry& e = s->e;
  if (warm_next_ && e.m && e.c && !e.in_reasoning && !e.c->masks->is_warm(*e.m))
    boost::asio::post(warm_pool_, [c = e.c, next = e.m->without_history()] { c->masks->warm(next); });
}

bool constraint_table::accept_locked(entry& e, std::uint64_t position, std::int32_t token) {
  const auto id = static_cast<std::uint32_t>(token);
  if (e.in_reasoning) {
    e.in_reasoning = !(think_end_ && id == *think_end_);
    return true;
  }
  if (!e.m || !e.next || position != *e.next)
    return true;
  e.next = position + 1;
  const auto& eos = vocab_->eos();
  if (id < vocab_->size() && std::find(eos.begin(), eos.end(), id) == eos.end())
    return e.c->masks->accept(*e.m, id);
  return true;
}

}  // namespace troupe::actors

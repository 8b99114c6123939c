// The entrypoint's structured-output constraint table (structured_output.hpp).
#include "actors/entrypoint/structured_output.hpp"

#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/json_schema.hpp"
#include "recipe/grammar/regex.hpp"

#include <algorithm>

namespace troupe::actors {

namespace gr = recipe::grammar;

namespace {
/// Compiled grammars kept for reuse; past this the oldest key is dropped.
constexpr std::size_t cache_limit = 256;
}  // namespace

constraint_table::constraint_table(const recipe::tokenizer& tok)
    : vocab_(std::make_shared<const gr::vocabulary>(gr::vocabulary::from_tokenizer(tok))),
      think_end_(tok.token_to_id("</think>")) {}

std::string constraint_table::format_key(const recipe::response_format& format) {
  using kind = recipe::response_format::kind;
  switch (format.type) {
    case kind::text: return {};
    case kind::json_object: return "object";
    case kind::json_schema: return "schema:" + format.schema_json;
    case kind::regex: return "regex:" + format.regex;
    case kind::grammar: return "grammar:" + format.grammar;
  }
  return {};
}

std::optional<recipe::response_format> constraint_table::format_of_key(const std::string& key) {
  using kind = recipe::response_format::kind;
  recipe::response_format f;
  auto rest = [&](std::string_view prefix) -> std::optional<std::string> {
    if (key.compare(0, prefix.size(), prefix) != 0)
      return std::nullopt;
    return key.substr(prefix.size());
  };
  if (key == "object") {
    f.type = kind::json_object;
  } else if (auto schema = rest("schema:")) {
    f.type = kind::json_schema;
    f.schema_json = std::move(*schema);
  } else if (auto pattern = rest("regex:")) {
    f.type = kind::regex;
    f.regex = std::move(*pattern);
  } else if (auto ebnf = rest("grammar:")) {
    f.type = kind::grammar;
    f.grammar = std::move(*ebnf);
  } else {
    return std::nullopt;
  }
  return f;
}

std::variant<std::shared_ptr<constraint_table::compiled>, recipe::api_error>
constraint_table::compile(const recipe::response_format& format, const std::string& param) {
  using kind = recipe::response_format::kind;
  const std::string key = format_key(format);
  auto error = [&](std::string message) {
    return recipe::api_error{400, std::move(message), "invalid_request_error", param, std::nullopt};
  };
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end())
      return it->second;
  }
  // Compiled outside the lock: the devices keep sampling meanwhile.
  gr::grammar g;
  if (format.type == kind::json_object) {
    g = gr::any_json_object();
  } else if (format.type == kind::json_schema) {
    auto r = gr::compile_json_schema(std::string_view(format.schema_json));
    if (auto* e = std::get_if<gr::schema_error>(&r))
      return error("Unsupported JSON schema for structured output: " + e->to_string() + ".");
    g = std::move(std::get<gr::grammar>(r));
  } else if (format.type == kind::grammar) {
    auto r = gr::compile_ebnf(format.grammar);
    if (auto* e = std::get_if<gr::ebnf_error>(&r))
      return error("Invalid grammar for structured output: " + e->to_string() + ".");
    g = std::move(std::get<gr::grammar>(r));
  } else {
    auto r = gr::compile_regex(format.regex);
    if (auto* e = std::get_if<gr::regex_error>(&r))
      return error("Unsupported regex for structured output: " + e->message + " at offset "
                   + std::to_string(e->offset) + ".");
    g = std::move(std::get<gr::grammar>(r));
  }
  auto c = std::make_shared<compiled>();
  c->grammar = std::make_shared<const gr::grammar>(std::move(g));
  c->masks = std::make_unique<gr::mask_computer>(c->grammar, vocab_);
  std::lock_guard lock(mu_);
  if (auto it = cache_.find(key); it != cache_.end())
    return it->second;  // compiled meanwhile by another thread
  if (cache_.size() >= cache_limit)
    cache_.erase(cache_.begin());
  cache_.emplace(key, c);
  return c;
}

std::optional<recipe::api_error> constraint_table::add(std::uint64_t id, const recipe::response_format& format,
                                                       bool thinking, const std::string& param) {
  if (format.type == recipe::response_format::kind::text)
    return std::nullopt;
  auto c = compile(format, param);
  if (auto* e = std::get_if<recipe::api_error>(&c))
    return *e;
  auto& compiled = std::get<std::shared_ptr<constraint_table::compiled>>(c);
  std::lock_guard lock(mu_);
  entries_.insert_or_assign(id, entry{compiled, gr::matcher(compiled->grammar), thinking, std::nullopt});
  return std::nullopt;
}

std::optional<std::string> constraint_table::restore(std::uint64_t id, const runtime::constraint_spec& spec,
                                                     std::span<const std::int32_t> context) {
  auto format = format_of_key(spec.format);
  if (!format || format->type == recipe::response_format::kind::text)
    return "not a structured-output format: '" + spec.format.substr(0, 40) + "'";
  auto c = compile(*format, "response_format");
  if (auto* e = std::get_if<recipe::api_error>(&c))
    return e->message;
  auto& compiled = std::get<std::shared_ptr<constraint_table::compiled>>(c);
  entry e{compiled, gr::matcher(compiled->grammar), spec.thinking, std::nullopt};
  std::lock_guard lock(mu_);
  for (auto p = spec.output_start; p < context.size(); ++p) {
    if (!e.in_reasoning && !e.next)
      e.next = p;  // where allowed() would have started
    if (!accept_locked(e, p, context[p]))
      return "the output so far (token " + std::to_string(context[p]) + " at position "
             + std::to_string(p) + ") does not follow the format";
  }
  entries_.insert_or_assign(id, std::move(e));
  return std::nullopt;
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
  std::lock_guard lock(mu_);
  auto it = entries_.find(sequence);
  if (it == entries_.end() || it->second.in_reasoning)
    return false;
  entry& e = it->second;
  if (!e.next)
    e.next = position;
  if (position < *e.next && e.m.rollback(*e.next - position))  // a step drawn again
    e.next = position;
  if (position != *e.next) {  // tokens the table never saw: end the output
    eos_only(mask);
    return true;
  }
  scratch_.assign(vocab_->mask_words(), 0u);
  e.c->masks->fill(e.m, scratch_);
  std::fill(mask.begin(), mask.end(), 0u);
  std::copy_n(scratch_.begin(), std::min(scratch_.size(), mask.size()), mask.begin());
  if (std::all_of(mask.begin(), mask.end(), [](std::uint32_t w) { return w == 0; }))
    eos_only(mask);
  return true;
}

void constraint_table::accepted(std::uint64_t sequence, std::uint64_t position, std::int32_t token) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(sequence);
  if (it != entries_.end())
    accept_locked(it->second, position, token);
}

bool constraint_table::accept_locked(entry& e, std::uint64_t position, std::int32_t token) {
  const auto id = static_cast<std::uint32_t>(token);
  if (e.in_reasoning) {
    e.in_reasoning = !(think_end_ && id == *think_end_);
    return true;
  }
  if (!e.next || position != *e.next)
    return true;
  e.next = position + 1;
  const auto& eos = vocab_->eos();
  if (id < vocab_->size() && std::find(eos.begin(), eos.end(), id) == eos.end())
    return e.m.accept_token(vocab_->bytes(id));
  return true;
}

}  // namespace troupe::actors

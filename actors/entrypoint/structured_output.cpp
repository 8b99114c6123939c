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

std::optional<recipe::api_error> constraint_table::add(std::uint64_t id, const recipe::response_format& format,
                                                       bool thinking, const std::string& param) {
  using kind = recipe::response_format::kind;
  if (format.type == kind::text)
    return std::nullopt;
  const std::string key = format.type == kind::json_object   ? std::string("object")
                          : format.type == kind::json_schema ? "schema:" + format.schema_json
                          : format.type == kind::grammar     ? "grammar:" + format.grammar
                                                             : "regex:" + format.regex;
  auto error = [&](std::string message) {
    return recipe::api_error{400, std::move(message), "invalid_request_error", param, std::nullopt};
  };
  std::shared_ptr<compiled> c;
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end())
      c = it->second;
  }
  if (!c) {  // compiled outside the lock: the devices keep sampling meanwhile
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
    c = std::make_shared<compiled>();
    c->grammar = std::make_shared<const gr::grammar>(std::move(g));
    c->masks = std::make_unique<gr::mask_computer>(c->grammar, vocab_);
  }
  std::lock_guard lock(mu_);
  if (cache_.size() >= cache_limit && !cache_.count(key))
    cache_.erase(cache_.begin());
  cache_.emplace(key, c);
  entries_.insert_or_assign(id, entry{c, gr::matcher(c->grammar), thinking, std::nullopt});
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
  if (it == entries_.end())
    return;
  entry& e = it->second;
  const auto id = static_cast<std::uint32_t>(token);
  if (e.in_reasoning) {
    e.in_reasoning = !(think_end_ && id == *think_end_);
    return;
  }
  if (!e.next || position != *e.next)
    return;
  e.next = position + 1;
  const auto& eos = vocab_->eos();
  if (id < vocab_->size() && std::find(eos.begin(), eos.end(), id) == eos.end())
    e.m.accept_token(vocab_->bytes(id));
}

}  // namespace troupe::actors

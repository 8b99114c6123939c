// Structural tags to grammar (structural_tag.hpp).
#include "recipe/grammar/structural_tag.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/json_schema.hpp"
#include "recipe/grammar/lark.hpp"
#include "recipe/grammar/regex.hpp"
#include "recipe/grammar/tool_calls.hpp"

namespace troupe::recipe::grammar {

using json = nlohmann::ordered_json;

std::string structural_tag_error::to_string() const { return message + " (at '#" + pointer + "')"; }

namespace {

struct failure {
  structural_tag_error e;
};

[[noreturn]] void fail(const std::string& pointer, std::string message) {
  throw failure{{pointer, std::move(message)}};
}

// Which of several strings ends where, over bytes (Aho-Corasick): node 0 is "nothing matched";
// `done[n]` lists the patterns that end at node n (a pattern ending inside a longer match too).
struct pattern_automaton {
  std::vector<std::array<std::int32_t, 256>> next;
  std::vector<std::vector<std::size_t>> done;

  explicit pattern_automaton(const std::vector<std::string>& patterns) {
    std::array<std::int32_t, 256> none;
    none.fill(-1);
    next.push_back(none);
    done.emplace_back();
    for (std::size_t p = 0; p < patterns.size(); ++p) {
      std::int32_t n = 0;
      for (const char ch : patterns[p]) {
        const auto c = static_cast<unsigned char>(ch);
        if (next[n][c] < 0) {
          next[n][c] = static_cast<std::int32_t>(next.size());
          next.push_back(none);  // invalidates references into `next`
          done.emplace_back();
        }
        n = next[n][c];
      }
      done[n].push_back(p);
    }
    // Breadth first: a node's fallback (its longest proper suffix that is a trie node) is done
    // before it, so its edges and its matches are complete.
    std::vector<std::int32_t> fallback(next.size(), 0);
    std::deque<std::int32_t> queue;
    for (auto& edge : next[0]) {
      if (edge < 0) edge = 0;
      else queue.push_back(edge);
    }
    while (!queue.empty()) {
      const auto n = queue.front();
      queue.pop_front();
      const auto f = fallback[n];
      done[n].insert(done[n].end(), done[f].begin(), done[f].end());
      for (unsigned c = 0; c < 256; ++c) {
        auto& edge = next[n][c];
        if (edge < 0) {
          edge = next[f][c];
        } else {
          fallback[edge] = next[f][c];
          queue.push_back(edge);
        }
      }
    }
  }
};

std::string child(const std::string& ptr, std::string_view key) { return json_pointer_child(ptr, key); }
std::string child(const std::string& ptr, std::size_t i) { return ptr + "/" + std::to_string(i); }

using emitter = std::function<void(nfa_builder&, std::uint32_t, std::uint32_t)>;

class compiler {
 public:
  compiler(const limits& lim, const token_names* tokens) : lim_(lim), tokens_(tokens) {}

  grammar run(const json& tag) {
    if (!tag.is_object()) fail("", "a structural tag must be a JSON object");
    if (const auto* t = member(tag, "type", ""); t && (!t->is_string() || *t != "structural_tag"))
      fail("/type", "the type of a structural tag must be 'structural_tag'");
    g_.rules.emplace_back();  // the root, built last
    nfa_builder b;
    const auto s = b.add_state(), a = b.add_state();
    if (tag.contains("format")) {
      emit(b, s, a, tag["format"], "/format", nullptr);
    } else if (tag.contains("structures")) {
      legacy(b, s, a, tag);
    } else {
      fail("", "a structural tag needs a 'format' (or the older 'structures' and 'triggers')");
    }
    try {
      g_.rules[0] = b.determinize(s, a, "structural tag", lim_);
    } catch (const build_error& e) {
      fail("", e.message);
    }
    if (g_.state_count() > lim_.max_total_states)
      fail("", "the structural tag needs more than " + std::to_string(lim_.max_total_states) + " automaton states");
    return std::move(g_);
  }

 private:
  // A tag of a tag list: its begin, its ends, and how its content is emitted.
  struct tag_view {
    std::string begin;
    std::vector<std::string> ends;
    std::optional<std::uint32_t> begin_token, end_token;  // a token instead of the begin / the ends
    emitter content;
    bool ends_inside = false;  // the content consumes one of the ends itself (free text last)
    std::string ptr;
  };

  static const json* member(const json& node, const char* key, const std::string& ptr, bool required = false) {
    if (!node.contains(key)) {
      if (required) fail(ptr, std::string("missing member '") + key + "'");
      return nullptr;
    }
    return &node[key];
  }
  // Refuses a member of `node` that is not in `known`: a misspelt member (`max_token`) is not
  // silently ignored.
  static void only(const json& node, const std::vector<std::string_view>& known, const std::string& ptr,
                   std::string_view what) {
    for (const auto& [key, value] : node.items()) {
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string list;
      for (const auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      fail(child(ptr, key), "unknown member '" + key + "': " + std::string(what) + " takes " + list);
    }
  }
  static std::string text(const json& node, const char* key, const std::string& ptr) {
    const json& v = *member(node, key, ptr, true);
    if (!v.is_string()) fail(child(ptr, key), std::string("'") + key + "' must be a string");
    return v.get<std::string>();
  }
  static bool flag(const json& node, const char* key, const std::string& ptr) {
    const json* v = member(node, key, ptr);
    if (!v || v->is_null()) return false;
    if (!v->is_boolean()) fail(child(ptr, key), std::string("'") + key + "' must be a boolean");
    return v->get<bool>();
  }
  static std::vector<std::string> texts(const json& node, const char* key, const std::string& ptr, bool required) {
    const json* v = member(node, key, ptr, required);
    std::vector<std::string> out;
    if (!v || v->is_null()) return out;
    if (!v->is_array()) fail(child(ptr, key), std::string("'") + key + "' must be an array of strings");
    for (std::size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string() || (*v)[i].get_ref<const std::string&>().empty())
        fail(child(child(ptr, key), i), std::string("'") + key + "' must hold non-empty strings");
      out.push_back((*v)[i].get<std::string>());
    }
    return out;
  }
  static const json& elements(const json& node, const char* key, const std::string& ptr) {
    const json& v = *member(node, key, ptr, true);
    if (!v.is_array() || v.empty()) fail(child(ptr, key), std::string("'") + key + "' must be a non-empty array");
    return v;
  }

  // Whether `node`, as a tag's content, ends at the tag's end by itself: free text (any_text,
  // triggered_tags) last in it.
  static bool ends_inside(const json& node) {
    if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) return false;
    const auto& type = node["type"].get_ref<const std::string&>();
    if (type == "any_text" || type == "triggered_tags") return true;
    if (type == "sequence" && node.contains("elements") && node["elements"].is_array() && !node["elements"].empty())
      return ends_inside(node["elements"].back());
    return false;
  }

  // `node` from `from` to `to`. `ends`: the enclosing tag's ends, when `node` consumes one of them
  // (ends_inside(node), the tag's content).
  void emit(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr,
            const std::vector<std::string>* ends) {
    if (!node.is_object()) fail(ptr, "a format must be a JSON object");
    if (++depth_ > 64) fail(ptr, "formats nested more than 64 levels deep");
    const std::string type = text(node, "type", ptr);
    known_members(node, type, ptr);
    if (type == "const_string") {
      b.literal(from, to, text(node, "value", ptr));
    } else if (type == "json_schema") {
      json_schema(b, from, to, node, ptr);
    } else if (type == "grammar") {
      call_compiled(b, from, to, ptr, [&] {
        const std::string g = text(node, "grammar", ptr);
        auto r = looks_like_lark(g) ? compile_lark(g, "start", lim_) : compile_ebnf(g, "root", lim_);
        if (auto* e = std::get_if<ebnf_error>(&r)) fail(child(ptr, "grammar"), "invalid grammar: " + e->to_string());
        return std::move(std::get<grammar>(r));
      });
    } else if (type == "regex") {
      call_compiled(b, from, to, ptr, [&] {
        auto r = compile_regex(text(node, "pattern", ptr), lim_);
        if (auto* e = std::get_if<regex_error>(&r))
          fail(child(ptr, "pattern"), "invalid regex: " + e->message + " at offset " + std::to_string(e->offset));
        return std::move(std::get<grammar>(r));
      });
    } else if (type == "any_text") {
      const auto excludes = texts(node, "excludes", ptr, false);
      const auto max_tokens = budget(node, "max_tokens", ptr), max_chars = budget(node, "max_chars", ptr);
      if (max_tokens == no_budget && max_chars == no_budget) {
        free_text(b, from, to, {}, excludes, ends, ptr);
      } else if (max_tokens == 0 || max_chars == 0) {  // no text: the end at once
        if (ends) for (const auto& e : *ends) b.literal(from, to, e);
        else b.epsilon(from, to);
      } else {
        budgeted_text(b, from, to, excludes, ends, max_tokens, max_chars, ptr);
      }
    } else if (type == "sequence") {
      const json& e = elements(node, "elements", ptr);
      std::uint32_t at = from;
      for (std::size_t i = 0; i < e.size(); ++i) {
        const bool last = i + 1 == e.size();
        const auto next = last ? to : b.add_state();
        emit(b, at, next, e[i], child(child(ptr, "elements"), i), last ? ends : nullptr);
        at = next;
      }
    } else if (type == "or") {
      const json& e = elements(node, "elements", ptr);
      for (std::size_t i = 0; i < e.size(); ++i) emit(b, from, to, e[i], child(child(ptr, "elements"), i), nullptr);
    } else if (type == "optional" || type == "plus" || type == "star" || type == "repeat") {
      repeat(b, from, to, node, ptr, type);
    } else if (type == "tag") {
      emit_tag(b, from, to, tag_of(node, ptr));
    } else if (type == "triggered_tags") {
      triggered_tags(b, from, to, node, ptr, ends);
    } else if (type == "tags_with_separator") {
      tags_with_separator(b, from, to, node, ptr);
    } else if (type == "dispatch") {
      dispatch(b, from, to, node, ptr);
    } else if (type == "token" || type == "exclude_token" || type == "any_tokens" || type == "token_triggered_tags" ||
               type == "token_dispatch") {
      token_level(b, from, to, node, ptr, type);
    } else {
      fail(child(ptr, "type"), "unknown format type '" + type + "'");
    }
    --depth_;
  }

  // The members XGrammar defines for each format type (an unknown type is refused after this).
  static void known_members(const json& node, const std::string& type, const std::string& ptr) {
    static const std::map<std::string, std::vector<std::string_view>, std::less<>> members = {
        {"const_string", {"type", "value"}},
        {"json_schema", {"type", "json_schema", "style", "any_order", "max_whitespace_cnt"}},
        {"grammar", {"type", "grammar"}},
        {"regex", {"type", "pattern"}},
        {"any_text", {"type", "excludes", "max_tokens", "max_chars"}},
        {"sequence", {"type", "elements"}},
        {"or", {"type", "elements"}},
        {"optional", {"type", "content"}},
        {"plus", {"type", "content"}},
        {"star", {"type", "content"}},
        {"repeat", {"type", "content", "min", "max"}},
        {"tag", {"type", "begin", "content", "end"}},
        {"triggered_tags", {"type", "triggers", "tags", "at_least_one", "stop_after_first", "excludes"}},
        {"tags_with_separator", {"type", "tags", "separator", "at_least_one", "stop_after_first"}},
        {"dispatch", {"type", "rules", "loop", "excludes"}},
        {"token", {"type", "token"}},
        {"exclude_token", {"type", "exclude_tokens"}},
        {"any_tokens", {"type", "exclude_tokens", "max_tokens"}},
        {"token_triggered_tags", {"type", "trigger_tokens", "tags", "exclude_tokens", "at_least_one", "stop_after_first"}},
        {"token_dispatch", {"type", "rules", "loop", "exclude_tokens"}},
    };
    if (const auto it = members.find(type); it != members.end()) only(node, it->second, ptr, "format '" + type + "'");
  }

  void token_level(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr,
                   const std::string& type) {
    if (!tokens_) fail(child(ptr, "type"), "token-level formats ('" + type + "') need the model's tokenizer");
    if (type == "token") {
      b.byte(from, to, symbol(false, {token_of(*member(node, "token", ptr, true), child(ptr, "token"))}, ptr));
    } else if (type == "exclude_token") {
      b.byte(from, to, symbol(true, excluded(node, ptr), ptr));
    } else if (type == "any_tokens") {
      any_tokens(b, from, to, node, ptr);
    } else if (type == "token_triggered_tags") {
      token_triggered_tags(b, from, to, node, ptr);
    } else {
      token_dispatch(b, from, to, node, ptr);
    }
  }

  void json_schema(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    const json* named = member(node, "style", ptr);
    // The canonical form writes at most one whitespace character in a row (`, `, `: `; DSML a
    // newline between parameters), so a cap of 1 or more holds already and 0 asks for the
    // compact form.
    const auto max_whitespace = budget(node, "max_whitespace_cnt", ptr);
    if (named && !named->is_null() && *named == "deepseek_xml") {
      if (flag(node, "any_order", ptr)) fail(child(ptr, "any_order"), "'any_order' is not supported with 'deepseek_xml'");
      if (max_whitespace == 0)
        fail(child(ptr, "max_whitespace_cnt"), "'deepseek_xml' writes a newline between parameters: the cap must be at least 1");
      const json& schema = *member(node, "json_schema", ptr, true);
      const std::string sptr = child(ptr, "json_schema");
      return call_compiled(b, from, to, ptr + "#deepseek_xml", [&] {
        auto r = compile_dsml_parameters(schema, false, lim_);
        if (auto* e = std::get_if<schema_error>(&r)) {
          const std::string where = e->keyword.empty() ? sptr + e->pointer : child(sptr + e->pointer, e->keyword);
          fail(where, "unsupported JSON schema: " + e->message);
        }
        return std::move(std::get<grammar>(r));
      });
    }
    if (named && !named->is_null() && *named != "json")
      fail(child(ptr, "style"), (named->is_string() ? "style '" + named->get<std::string>() + "'" : std::string("this style")) +
                                    " is not supported: a DeepSeek model's parameters are 'deepseek_xml' (or 'json')");
    json_style style;
    style.any_order = flag(node, "any_order", ptr);
    style.compact = max_whitespace == 0;
    const json& schema = *member(node, "json_schema", ptr, true);
    schema_call(b, from, to, schema, child(ptr, "json_schema"), style);
  }
  void schema_call(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& schema, const std::string& ptr,
                   json_style style = {}) {
    if (auto it = compiled_.find(ptr); it != compiled_.end()) return b.call(from, to, it->second);
    schema_rules rules(schema, g_, lim_, style);
    auto r = rules.value(schema, "");
    if (auto* e = std::get_if<schema_error>(&r)) {
      const std::string where = e->keyword.empty() ? ptr + e->pointer : child(ptr + e->pointer, e->keyword);
      fail(where, "unsupported JSON schema: " + e->message);
    }
    compiled_[ptr] = std::get<std::uint32_t>(r);
    b.call(from, to, std::get<std::uint32_t>(r));
  }
  template <class Compile>
  void call_compiled(nfa_builder& b, std::uint32_t from, std::uint32_t to, const std::string& ptr, Compile compile) {
    auto it = compiled_.find(ptr);
    if (it == compiled_.end()) it = compiled_.emplace(ptr, append_rules(g_, compile())).first;
    b.call(from, to, it->second);
  }

  void repeat(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr,
              const std::string& type) {
    std::int64_t lo = type == "plus" ? 1 : 0, hi = type == "optional" ? 1 : -1;
    if (type == "repeat") {
      for (const char* key : {"min", "max"})
        if (!member(node, key, ptr, true)->is_number_integer()) fail(child(ptr, key), std::string("'") + key + "' must be an integer");
      lo = node["min"].get<std::int64_t>();
      hi = node["max"].get<std::int64_t>();
      if (lo < 0 || lo > lim_.max_repeat) fail(child(ptr, "min"), "'min' must be 0 to " + std::to_string(lim_.max_repeat));
      if (hi != -1 && (hi < lo || hi > lim_.max_repeat))
        fail(child(ptr, "max"), "'max' must be -1 or 'min' to " + std::to_string(lim_.max_repeat));
    }
    const json& content = *member(node, "content", ptr, true);
    const std::string cptr = child(ptr, "content");
    // lo copies, then (hi - lo) optional ones or a loop.
    std::uint32_t at = from;
    for (std::int64_t i = 0; i < lo; ++i) {
      const auto next = b.add_state();
      emit(b, at, next, content, cptr, nullptr);
      at = next;
    }
    if (hi == -1) {
      const auto again = b.add_state();
      b.epsilon(at, again);
      emit(b, again, at, content, cptr, nullptr);
    } else {
      for (std::int64_t i = lo; i < hi; ++i) {
        const auto next = b.add_state();
        b.epsilon(at, to);
        emit(b, at, next, content, cptr, nullptr);
        at = next;
      }
    }
    b.epsilon(at, to);
  }

  tag_view tag_of(const json& node, const std::string& ptr) {
    if (!node.is_object()) fail(ptr, "a tag must be a JSON object");
    if (const json* t = member(node, "type", ptr); t && *t != "tag") fail(child(ptr, "type"), "a tag's type must be 'tag'");
    only(node, {"type", "begin", "content", "end"}, ptr, "a tag");
    tag_view t;
    t.ptr = ptr;
    const json& begin = *member(node, "begin", ptr, true);
    if (begin.is_string()) t.begin = begin.get<std::string>();
    else if (begin.is_object()) t.begin_token = token_format(begin, child(ptr, "begin"));
    else fail(child(ptr, "begin"), "'begin' must be a string or a token format");
    const json& end = *member(node, "end", ptr, true);
    if (end.is_string()) t.ends = {end.get<std::string>()};
    else if (end.is_array()) t.ends = texts(node, "end", ptr, true);
    else if (end.is_object()) t.end_token = token_format(end, child(ptr, "end"));
    else fail(child(ptr, "end"), "'end' must be a string, an array of strings or a token format");
    if (t.ends.empty() && !t.end_token) fail(child(ptr, "end"), "'end' must not be an empty array");
    const json& content = *member(node, "content", ptr, true);
    t.ends_inside = !t.end_token && ends_inside(content);
    const std::string cptr = child(ptr, "content");
    t.content = [this, &content, cptr, ends = t.ends, inside = t.ends_inside](nfa_builder& b, std::uint32_t from,
                                                                              std::uint32_t to) {
      emit(b, from, to, content, cptr, inside ? &ends : nullptr);
    };
    return t;
  }

  // begin, content, one of the ends; from `from` to `to`. `skip`: bytes of begin already matched.
  void emit_tag(nfa_builder& b, std::uint32_t from, std::uint32_t to, const tag_view& t, std::size_t skip = 0) {
    const auto open = b.add_state();
    if (t.begin_token) b.byte(from, open, symbol(false, {*t.begin_token}, child(t.ptr, "begin")));
    else b.literal(from, open, std::string_view(t.begin).substr(skip));
    // The token-level formats inside exclude this tag's end token (none with end strings).
    const auto outer = enclosing_end_;
    enclosing_end_ = t.end_token;
    if (t.ends_inside) {
      t.content(b, open, to);
    } else {
      const auto body = b.add_state();
      t.content(b, open, body);
      if (t.end_token) b.byte(body, to, symbol(false, {*t.end_token}, child(t.ptr, "end")));
      for (const auto& e : t.ends) b.literal(body, to, e);
    }
    enclosing_end_ = outer;
  }

  // A token: its id, or its string (an added token's content or a text token's text).
  std::uint32_t token_of(const json& v, const std::string& ptr, bool eos_ok = false) const {
    const token_names& n = *tokens_;
    std::uint32_t id = 0;
    if (v.is_number_integer()) {
      const auto i = v.get<std::int64_t>();
      if (i < 0 || i >= n.vocab_size)
        fail(ptr, "token id " + std::to_string(i) + " is not in the vocabulary (0 to " +
                      std::to_string(n.vocab_size - 1) + ")");
      id = static_cast<std::uint32_t>(i);
    } else if (v.is_string()) {
      const auto found = n.id_of ? n.id_of(v.get_ref<const std::string&>()) : std::nullopt;
      if (!found) fail(ptr, "unknown token '" + v.get<std::string>() + "'");
      id = *found;
    } else {
      fail(ptr, "a token must be a token id or a token's string");
    }
    if (!eos_ok && std::find(n.eos.begin(), n.eos.end(), id) != n.eos.end())
      fail(ptr, "the end-of-sequence token ends the output: a format cannot hold it");
    return id;
  }
  // {"type": "token", "token": ...} as a tag's begin or end.
  std::uint32_t token_format(const json& node, const std::string& ptr) const {
    if (const json* t = member(node, "type", ptr); !t || *t != "token")
      fail(child(ptr, "type"), "a begin or end that is not a string must be {\"type\": \"token\", \"token\": ...}");
    only(node, {"type", "token"}, ptr, "format 'token'");
    if (!tokens_) fail(child(ptr, "type"), "token-level formats ('token') need the model's tokenizer");
    return token_of(*member(node, "token", ptr, true), child(ptr, "token"));
  }
  std::vector<std::uint32_t> token_list(const json& node, const char* key, const std::string& ptr, bool required,
                                        bool eos_ok) const {
    const json* v = member(node, key, ptr, required);
    std::vector<std::uint32_t> out;
    if (!v || v->is_null()) return out;
    if (!v->is_array()) fail(child(ptr, key), std::string("'") + key + "' must be an array of token ids or strings");
    for (std::size_t i = 0; i < v->size(); ++i) out.push_back(token_of((*v)[i], child(child(ptr, key), i), eos_ok));
    if (required && out.empty()) fail(child(ptr, key), std::string("'") + key + "' must not be empty");
    return out;
  }
  // The format's exclude_tokens and the enclosing tag's end token.
  std::vector<std::uint32_t> excluded(const json& node, const std::string& ptr) const {
    auto out = token_list(node, "exclude_tokens", ptr, false, true);
    if (enclosing_end_) out.push_back(*enclosing_end_);
    return out;
  }
  // The symbol byte standing for one token (`any` false) or for any text token but `ids`.
  unsigned char symbol(bool any, std::vector<std::uint32_t> ids, const std::string& ptr) {
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (const auto& t : g_.symbols)
      if (t.any == any && t.ids == ids) return t.byte;
    if (g_.symbols.size() == std::size(symbol_bytes))
      fail(ptr, "a structural tag may name at most " + std::to_string(std::size(symbol_bytes)) +
                    " different tokens and token exclusions");
    g_.symbols.push_back({symbol_bytes[g_.symbols.size()], any, std::move(ids)});
    return g_.symbols.back().byte;
  }

  void any_tokens(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    const auto sym = symbol(true, excluded(node, ptr), ptr);
    const auto max = budget(node, "max_tokens", ptr);
    if (max == 0) return b.epsilon(from, to);
    if (max == no_budget) {
      const auto loop = b.add_state();
      b.epsilon(from, loop);
      b.byte(loop, loop, sym);
      b.epsilon(loop, to);
      return;
    }
    // At most `max` of them: a rule of its own whose token budget the matcher counts.
    nfa_builder sub;
    const auto loop = sub.add_state(), done = sub.add_state();
    sub.byte(loop, loop, sym);
    sub.epsilon(loop, done);
    b.call(from, to, budgeted_rule(sub, loop, done, "any_tokens", max, no_budget, ptr));
  }

  // A budget member (max_tokens, max_chars, max_whitespace_cnt): no_budget when absent or null.
  static std::uint32_t budget(const json& node, const char* key, const std::string& ptr) {
    const json* v = member(node, key, ptr);
    if (!v || v->is_null()) return no_budget;
    if (!v->is_number_integer() || v->get<std::int64_t>() < 0 || v->get<std::int64_t>() > 2147483647)
      fail(child(ptr, key), std::string("'") + key + "' must be null or 0 to 2147483647");
    return static_cast<std::uint32_t>(v->get<std::int64_t>());
  }

  // `sub`'s automaton from `start` to `accept` as a rule of the grammar with these budgets (a
  // rule without calls: the matcher counts them in its stacks); its index.
  std::uint32_t budgeted_rule(const nfa_builder& sub, std::uint32_t start, std::uint32_t accept, const char* name,
                              std::uint32_t max_tokens, std::uint32_t max_chars, const std::string& ptr) {
    rule r;
    try {
      r = sub.determinize(start, accept, name, lim_);
    } catch (const build_error& e) {
      fail(ptr, e.message);
    }
    r.max_tokens = max_tokens;
    r.max_chars = max_chars;
    g_.rules.push_back(std::move(r));
    return static_cast<std::uint32_t>(g_.rules.size() - 1);
  }

  // any_text with a budget: text that holds no exclude, in a rule of its own (budgeted_rule),
  // then (`ends`) one of the ends. The budget counts the text, not the end: for each end a rule
  // whose text may stop exactly where that end, written next, is the first pattern found (the
  // free text's reading: the text stops at the first end).
  void budgeted_text(nfa_builder& b, std::uint32_t from, std::uint32_t to, const std::vector<std::string>& excludes,
                     const std::vector<std::string>* ends, std::uint32_t max_tokens, std::uint32_t max_chars,
                     const std::string& ptr) {
    std::vector<std::string> patterns = excludes;
    const std::size_t first_end = patterns.size();
    if (ends) patterns.insert(patterns.end(), ends->begin(), ends->end());
    const pattern_automaton ac(patterns);
    if (ac.next.size() > lim_.max_rule_states)
      fail(ptr, "free text with patterns longer than " + std::to_string(lim_.max_rule_states) + " bytes in all");
    const std::size_t alternatives = ends ? ends->size() : 1;
    for (std::size_t e = 0; e < alternatives; ++e) {
      // Whether text that leaves the automaton in state n may stop there.
      const auto may_stop = [&](std::size_t n) {
        if (!ends) return true;
        const std::string& end = (*ends)[e];
        std::int32_t m = static_cast<std::int32_t>(n);
        for (std::size_t i = 0; i < end.size(); ++i) {
          m = ac.next[static_cast<std::size_t>(m)][static_cast<unsigned char>(end[i])];
          const auto& found = ac.done[static_cast<std::size_t>(m)];
          if (i + 1 < end.size() ? !found.empty()
                                 : std::find(found.begin(), found.end(), first_end + e) == found.end())
            return false;
        }
        return true;
      };
      // States (pattern automaton state, place in a UTF-8 character), made as reached; with a
      // character budget the text is UTF-8, so that a spent budget leaves only the rest of a
      // character begun (without one, any bytes: free text's reading).
      const bool utf8 = max_chars != no_budget;
      nfa_builder sub;
      std::map<std::pair<std::size_t, int>, std::uint32_t> state;
      std::vector<std::pair<std::size_t, int>> todo{{0, 0}};
      state[{0, 0}] = sub.add_state();
      const auto accept = sub.add_state();
      while (!todo.empty()) {
        const auto [n, u] = todo.back();
        todo.pop_back();
        const auto from_state = state[{n, u}];
        if (u == 0 && may_stop(n)) sub.epsilon(from_state, accept);
        std::map<std::pair<std::size_t, int>, byte_set> by_target;
        for (unsigned c = 0; c < 256; ++c) {
          const auto n2 = static_cast<std::size_t>(ac.next[n][c]);
          const int u2 = utf8 ? utf8_step(u, c) : 0;
          if (c == dsml_byte || is_symbol_byte(c) || !ac.done[n2].empty() || u2 < 0) continue;
          by_target[{n2, u2}].set(c);
        }
        for (const auto& [target, set] : by_target) {
          auto [it, fresh] = state.try_emplace(target, 0);
          if (fresh) {
            if (state.size() > lim_.max_rule_states)
              fail(ptr, "budgeted free text needs more than " + std::to_string(lim_.max_rule_states) + " states");
            it->second = sub.add_state();
            todo.push_back(target);
          }
          sub.bytes(from_state, it->second, set);
        }
      }
      const auto text = budgeted_rule(sub, state.at({0, 0}), accept, "any_text", max_tokens, max_chars, ptr);
      if (!ends) return b.call(from, to, text);
      const auto mid = b.add_state();
      b.call(from, mid, text);
      b.literal(mid, to, (*ends)[e]);
    }
  }

  // Any tokens in which a trigger token starts the tag that begins with it.
  void token_triggered_tags(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node,
                            const std::string& ptr) {
    const auto triggers = token_list(node, "trigger_tokens", ptr, true, false);
    const auto all = tags(node, ptr);
    for (const auto& t : all) {
      if (!t.begin_token)
        fail(child(t.ptr, "begin"), "a tag of token_triggered_tags must begin with a token format");
      if (std::find(triggers.begin(), triggers.end(), *t.begin_token) == triggers.end())
        fail(child(t.ptr, "begin"), "the begin token is none of the trigger tokens");
    }
    auto excl = excluded(node, ptr);
    excl.insert(excl.end(), triggers.begin(), triggers.end());
    const auto sym = symbol(true, std::move(excl), ptr);
    const bool at_least_one = flag(node, "at_least_one", ptr), stop_after_first = flag(node, "stop_after_first", ptr);
    const auto again = b.add_state(), done = b.add_state();
    b.epsilon(done, stop_after_first ? to : again);
    b.byte(again, again, sym);
    b.epsilon(again, to);
    for (const auto& t : all) emit_tag(b, again, done, t);
    if (at_least_one) {  // no tokens before the first tag
      for (const auto& t : all) emit_tag(b, from, done, t);
    } else {
      b.epsilon(from, again);
    }
  }

  // Any tokens in which a rule's token is followed by its format; then any tokens again (`loop`,
  // the default) or the end.
  void token_dispatch(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    const json& list = elements(node, "rules", ptr);
    const bool loop = !node.contains("loop") || node["loop"].is_null() || flag(node, "loop", ptr);
    auto excl = excluded(node, ptr);
    std::vector<std::uint32_t> starts;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string rptr = child(child(ptr, "rules"), i);
      if (!list[i].is_array() || list[i].size() != 2) fail(rptr, "a rule must be [token, format]");
      starts.push_back(token_of(list[i][0], child(rptr, 0)));
    }
    excl.insert(excl.end(), starts.begin(), starts.end());
    const auto sym = symbol(true, std::move(excl), ptr);
    const auto again = b.add_state();
    b.epsilon(from, again);
    b.byte(again, again, sym);
    b.epsilon(again, to);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string rptr = child(child(ptr, "rules"), i);
      const auto mid = b.add_state();
      b.byte(again, mid, symbol(false, {starts[i]}, child(rptr, 0)));
      emit(b, mid, loop ? again : to, list[i][1], child(rptr, 1), nullptr);
    }
  }

  // Free text from `from`: any bytes but the DSML byte and the symbol bytes (no control token),
  // never holding an exclude. When a dispatch
  // pattern ends, that rule's continuation follows (back to `again` after it, or to `to`). With
  // `ends`, the text ends at the first end (consumed) and goes to `to`; without, it may end
  // anywhere.
  struct rule_to {
    std::string pattern;
    std::function<void(nfa_builder&, std::uint32_t from)> then;  // from just after the pattern
  };
  void free_text(nfa_builder& b, std::uint32_t from, std::uint32_t to, const std::vector<rule_to>& rules,
                 const std::vector<std::string>& excludes, const std::vector<std::string>* ends,
                 const std::string& ptr) {
    std::vector<std::string> patterns;
    for (const auto& r : rules) patterns.push_back(r.pattern);
    const std::size_t first_exclude = patterns.size();
    patterns.insert(patterns.end(), excludes.begin(), excludes.end());
    const std::size_t first_end = patterns.size();
    if (ends) patterns.insert(patterns.end(), ends->begin(), ends->end());
    const pattern_automaton ac(patterns);
    if (ac.next.size() > lim_.max_rule_states)
      fail(ptr, "free text with patterns longer than " + std::to_string(lim_.max_rule_states) + " bytes in all");
    std::vector<std::uint32_t> state(ac.next.size());
    state[0] = from;
    for (std::size_t n = 1; n < state.size(); ++n) state[n] = b.add_state();
    for (std::size_t n = 0; n < state.size(); ++n) {
      if (!ac.done[n].empty()) {  // a pattern ended: the text stops here
        for (const auto p : ac.done[n]) {
          if (p < first_exclude) rules[p].then(b, state[n]);
          else if (p >= first_end) b.epsilon(state[n], to);
        }
        continue;
      }
      if (!ends) b.epsilon(state[n], to);
      std::map<std::int32_t, byte_set> by_target;
      for (unsigned c = 0; c < 256; ++c)
        if (c != dsml_byte && !is_symbol_byte(c)) by_target[ac.next[n][c]].set(c);
      for (const auto& [target, set] : by_target) b.bytes(state[n], state[target], set);
    }
  }

  std::vector<tag_view> tags(const json& node, const std::string& ptr) {
    const json& list = elements(node, "tags", ptr);
    std::vector<tag_view> out;
    for (std::size_t i = 0; i < list.size(); ++i) out.push_back(tag_of(list[i], child(child(ptr, "tags"), i)));
    return out;
  }

  void triggered_tags(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr,
                      const std::vector<std::string>* ends) {
    triggered(b, from, to, texts(node, "triggers", ptr, true), tags(node, ptr), flag(node, "at_least_one", ptr),
              flag(node, "stop_after_first", ptr), texts(node, "excludes", ptr, false), ends, ptr);
  }

  // Free text in which trigger t starts one of the tags whose begin starts with t.
  void triggered(nfa_builder& b, std::uint32_t from, std::uint32_t to, const std::vector<std::string>& triggers,
                 const std::vector<tag_view>& all, bool at_least_one, bool stop_after_first,
                 const std::vector<std::string>& excludes, const std::vector<std::string>* ends, const std::string& ptr) {
    if (triggers.empty()) fail(child(ptr, "triggers"), "'triggers' must not be empty");
    std::vector<std::vector<const tag_view*>> by_trigger(triggers.size());
    for (const auto& t : all) {
      if (t.begin_token)
        fail(child(t.ptr, "begin"), "a tag of triggered_tags must begin with a string (token_triggered_tags takes tokens)");
      std::size_t matched = 0;
      for (std::size_t i = 0; i < triggers.size(); ++i)
        if (t.begin.starts_with(triggers[i])) {
          by_trigger[i].push_back(&t);
          ++matched;
        }
      if (matched != 1)
        fail(child(t.ptr, "begin"), matched ? "the begin starts with more than one trigger"
                                            : "the begin starts with no trigger");
    }
    // After a tag: the free text again, or (stop_after_first) the end of this format.
    const auto again = b.add_state();
    const auto done = b.add_state();
    if (stop_after_first) {
      if (ends) for (const auto& e : *ends) b.literal(done, to, e);
      else b.epsilon(done, to);
    } else {
      b.epsilon(done, again);
    }
    std::vector<rule_to> rules;
    for (std::size_t i = 0; i < triggers.size(); ++i)
      rules.push_back({triggers[i], [&, i](nfa_builder& nb, std::uint32_t at) {
                         for (const auto* t : by_trigger[i]) emit_tag(nb, at, done, *t, triggers[i].size());
                       }});
    if (at_least_one) {  // no text before the first tag
      for (const auto& t : all) emit_tag(b, from, done, t);
    } else {
      b.epsilon(from, again);
    }
    free_text(b, again, to, rules, excludes, ends, ptr);
  }

  void tags_with_separator(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node,
                           const std::string& ptr) {
    const auto all = tags(node, ptr);
    const std::string separator = text(node, "separator", ptr);
    const bool at_least_one = flag(node, "at_least_one", ptr), stop_after_first = flag(node, "stop_after_first", ptr);
    if (!at_least_one) b.epsilon(from, to);
    const auto one = b.add_state();
    for (const auto& t : all) emit_tag(b, from, one, t);
    b.epsilon(one, to);
    if (!stop_after_first) {
      const auto more = b.add_state();
      b.literal(one, more, separator);
      for (const auto& t : all) emit_tag(b, more, one, t);
    }
  }

  void dispatch(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& node, const std::string& ptr) {
    const json& list = elements(node, "rules", ptr);
    const bool loop = !node.contains("loop") || node["loop"].is_null() || flag(node, "loop", ptr);
    const auto again = b.add_state();
    b.epsilon(from, again);
    std::vector<rule_to> rules;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string rptr = child(child(ptr, "rules"), i);
      const json& r = list[i];
      if (!r.is_array() || r.size() != 2 || !r[0].is_string() || r[0].get_ref<const std::string&>().empty())
        fail(rptr, "a rule must be [pattern, format] with a non-empty pattern string");
      rules.push_back({r[0].get<std::string>(), [&, rptr](nfa_builder& nb, std::uint32_t at) {
                         emit(nb, at, loop ? again : to, r[1], child(rptr, 1), nullptr);
                       }});
    }
    free_text(b, again, to, rules, texts(node, "excludes", ptr, false), nullptr, ptr);
  }

  // {"structures": [{"begin", "schema", "end"}], "triggers": [...]}: triggered tags of JSON.
  void legacy(nfa_builder& b, std::uint32_t from, std::uint32_t to, const json& tag) {
    const json& list = elements(tag, "structures", "");
    std::vector<tag_view> all;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string ptr = child(std::string("/structures"), i);
      const json& s = list[i];
      if (!s.is_object()) fail(ptr, "a structure must be a JSON object");
      only(s, {"begin", "schema", "end"}, ptr, "a structure");
      tag_view t;
      t.ptr = ptr;
      t.begin = text(s, "begin", ptr);
      t.ends = {text(s, "end", ptr)};
      const json& schema = *member(s, "schema", ptr, true);
      const std::string sptr = child(ptr, "schema");
      t.content = [this, &schema, sptr](nfa_builder& nb, std::uint32_t f, std::uint32_t a) {
        schema_call(nb, f, a, schema, sptr);
      };
      all.push_back(std::move(t));
    }
    triggered(b, from, to, texts(tag, "triggers", "", true), all, false, false, {}, nullptr, "");
  }

  const limits& lim_;
  const token_names* tokens_;
  std::optional<std::uint32_t> enclosing_end_;  // the end token of the tag being emitted
  grammar g_;
  std::map<std::string, std::uint32_t> compiled_;  // rules of schemas, grammars, regexes by pointer
  int depth_ = 0;
};

}  // namespace

std::variant<grammar, structural_tag_error> compile_structural_tag(const json& tag, const limits& lim,
                                                                   const token_names* tokens) {
  try {
    grammar g = compiler(lim, tokens).run(tag);
    if (auto r = left_recursive_rule(g); !r.empty())
      return structural_tag_error{"", "recursion that consumes no output (left recursion) through " + r};
    if (!prune(g)) return structural_tag_error{"", "the structural tag allows no output"};
    return g;
  } catch (const failure& f) {
    return f.e;
  }
}

std::variant<grammar, structural_tag_error> compile_structural_tag(std::string_view text, const limits& lim,
                                                                   const token_names* tokens) {
  if (json_nesting(text) > 128) return structural_tag_error{"", "the structural tag is nested more than 128 levels deep"};
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return structural_tag_error{"", "the structural tag is not valid JSON"};
  return compile_structural_tag(j, lim, tokens);
}

}  // namespace troupe::recipe::grammar

#include "recipe/tokenizer.hpp"

#include "recipe/unicode_classes.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace troupe::recipe {
namespace {

using json = nlohmann::json;

[[noreturn]] void unsupported(const std::string& what) {
  throw std::runtime_error("tokenizer.json: unsupported " + what);
}

// ---------------------------------------------------------------- UTF-8

// Reads one sequence at p[0..n). Returns its length (> 0) with cp set when valid; -k when the
// first k bytes are a maximal invalid subpart; 0 when p[0..n) is a valid but unfinished prefix.
int utf8_next(const unsigned char* p, std::size_t n, std::uint32_t& cp) {
  const unsigned char c = p[0];
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  int len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  std::uint32_t v = c & (0xFF >> (len + 1));
  for (int k = 1; k < len; ++k) {
    if (static_cast<std::size_t>(k) >= n) return 0;
    const unsigned char b = p[k];
    if (b < lo || b > hi) return -k;
    lo = 0x80;
    hi = 0xBF;
    v = (v << 6) | (b & 0x3F);
  }
  cp = v;
  return len;
}


constexpr std::string_view replacement = "\xEF\xBF\xBD";

// Appends the valid part of s to out, invalid subparts as U+FFFD. Returns the number of bytes
// consumed: all of s when final, otherwise up to an unfinished trailing sequence.
std::size_t sanitize_into(std::string_view s, std::string& out, bool final) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t i = 0;
  while (i < s.size()) {
    std::uint32_t cp;
    const int r = utf8_next(p + i, s.size() - i, cp);
    if (r > 0) {
      out.append(s.data() + i, static_cast<std::size_t>(r));
      i += static_cast<std::size_t>(r);
    } else if (r < 0) {
      out += replacement;
      i += static_cast<std::size_t>(-r);
    } else {
      if (!final) return i;
      out += replacement;
      return s.size();
    }
  }
  return i;
}

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t i = 0;
  while (i < s.size()) {
    std::uint32_t cp;
    const int r = utf8_next(p + i, s.size() - i, cp);
    if (r <= 0) return false;
    i += static_cast<std::size_t>(r);
  }
  return true;
}

// ---------------------------------------------------------------- character classes

enum : std::uint16_t {
  c_n = unicode::number,         // \p{N}
  c_l = unicode::letter,         // \p{L}
  c_m = unicode::mark,           // \p{M}
  c_p = unicode::punctuation,    // \p{P}
  c_s = unicode::symbol,         // \p{S}
  c_ws = unicode::white_space,   // Oniguruma \s: U+0009-000D, U+0085, Zs, Zl, Zp
  c_crlf = 1 << 6,    // \r \n
  c_cjk = 1 << 7,     // [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]
  c_apunct = 1 << 8,  // [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]
  c_alpha = 1 << 9,   // [A-Za-z]
  c_space = 1 << 10,  // ' '
};

std::uint16_t compute_class(std::uint32_t cp) {
  std::uint16_t m = unicode::classes(cp);  // c_n ... c_ws
  if (cp == '\r' || cp == '\n') m |= c_crlf;
  if ((cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) ||
      (cp >= 0x30A0 && cp <= 0x30FF))
    m |= c_cjk;
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
      (cp >= 123 && cp <= 126))
    m |= c_apunct;
  if ((cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z')) m |= c_alpha;
  if (cp == ' ') m |= c_space;
  return m;
}

const std::vector<std::uint16_t>& bmp_classes() {
  static const std::vector<std::uint16_t> table = [] {
    std::vector<std::uint16_t> t(0x10000);
    for (std::uint32_t cp = 0; cp < 0x10000; ++cp) t[cp] = compute_class(cp);
    return t;
  }();
  return table;
}

inline std::uint16_t char_class(std::uint32_t cp) {
  return cp < 0x10000 ? bmp_classes()[cp] : compute_class(cp);
}

// ---------------------------------------------------------------- byte level

// GPT-2's byte <-> printable character map.
struct byte_map {
  std::array<std::uint32_t, 256> to_char{};
  std::unordered_map<std::uint32_t, unsigned char> to_byte;
  byte_map() {
    std::uint32_t extra = 0;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_char[b] = printable ? b : 256 + extra++;
      to_byte[to_char[b]] = static_cast<unsigned char>(b);
    }
  }
};

const byte_map& bytes() {
  static const byte_map m;
  return m;
}

// The bytes a byte-level token string stands for; nullopt if a character is outside the map.
std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  std::size_t i = 0;
  while (i < token.size()) {
    std::uint32_t cp;
    const int r = utf8_next(p + i, token.size() - i, cp);
    if (r <= 0) return std::nullopt;
    const auto it = bytes().to_byte.find(cp);
    if (it == bytes().to_byte.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += static_cast<std::size_t>(r);
  }
  return out;
}

// ---------------------------------------------------------------- added-token matcher

// A byte trie, matched leftmost-longest (as HF's aho-corasick MatchKind::LeftmostLongest).
struct trie {
  struct node {
    std::vector<std::pair<unsigned char, int>> kids;
    int value = -1;  // index into tokenizer::impl::added
  };
  std::vector<node> nodes{1};
  std::array<bool, 256> first{};

  void insert(std::string_view s, int value) {
    if (s.empty()) return;
    int at = 0;
    for (const unsigned char c : s) {
      auto& kids = nodes[static_cast<std::size_t>(at)].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [c](const auto& k) { return k.first == c; });
      if (it == kids.end()) {
        nodes.emplace_back();
        const int id = static_cast<int>(nodes.size() - 1);
        nodes[static_cast<std::size_t>(at)].kids.emplace_back(c, id);
        at = id;
      } else {
        at = it->second;
      }
    }
    nodes[static_cast<std::size_t>(at)].value = value;
    first[static_cast<unsigned char>(s[0])] = true;
  }
  bool empty() const { return nodes.size() == 1; }

  // The longest match starting at i: {length, value}, or {0, -1}.
  std::pair<std::size_t, int> longest_at(std::string_view s, std::size_t i) const {
    std::pair<std::size_t, int> best{0, -1};
    int at = 0;
    for (std::size_t j = i; j < s.size(); ++j) {
      const auto c = static_cast<unsigned char>(s[j]);
      const auto& kids = nodes[static_cast<std::size_t>(at)].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [c](const auto& k) { return k.first == c; });
      if (it == kids.end()) break;
      at = it->second;
      if (nodes[static_cast<std::size_t>(at)].value >= 0)
        best = {j + 1 - i, nodes[static_cast<std::size_t>(at)].value};
    }
    return best;
  }
};

std::string read_file(const std::filesystem::path& path) {
  const auto name = path.string();
  if (name.size() > 3 && name.ends_with(".gz")) {
    gzFile f = gzopen(name.c_str(), "rb");
    if (!f) throw std::runtime_error("cannot open " + name);
    std::string out;
    std::array<char, 1 << 16> buf;
    int n;
    while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0)
      out.append(buf.data(), static_cast<std::size_t>(n));
    const bool bad = n < 0;
    gzclose(f);
    if (bad) throw std::runtime_error("cannot decompress " + name);
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + name);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The pre-tokenizer this implementation knows, as written in tokenizer.json.
constexpr std::string_view re_digits = "\\p{N}{1,3}";
constexpr std::string_view re_cjk =
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
constexpr std::string_view re_main =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

}  // namespace

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---------------------------------------------------------------- impl

struct tokenizer::impl {
  struct added_token {
    std::string content;
    token_id id;
    bool special;
    bool normalized;
  };
  struct merge {
    std::uint32_t rank;
    token_id id;
  };

  std::unordered_map<std::string, token_id> vocab;  // byte-level strings
  std::unordered_map<std::uint64_t, merge> merges;  // (left << 32 | right)
  std::array<token_id, 256> byte_id{};
  std::vector<added_token> added;
  std::unordered_map<std::string, token_id> added_by_content;
  trie raw_trie;         // normalized == false: matched on the raw text first
  trie normalized_trie;  // normalized == true: matched on the rest
  std::vector<std::string> decoded;  // id -> bytes
  std::vector<std::uint8_t> id_kind;  // 0 unknown, 1 model, 2 added, 3 added special

  // Pieces already merged, in shards by hash so that threads tokenizing in parallel
  // (recipe/parallel.hpp) rarely wait for each other; each shard on cache lines of its own (no
  // false sharing of the locks), looked up by string_view (no allocation on a hit).
  struct piece_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  struct alignas(64) cache_shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<token_id>, piece_hash, std::equal_to<>> pieces;
  };
  static constexpr std::size_t cache_shards = 64;
  static constexpr std::size_t cache_capacity = (1 << 18) / cache_shards;  // per shard
  mutable std::array<cache_shard, cache_shards> cache;
  cache_shard& shard(std::string_view piece) const {
    return cache[std::hash<std::string_view>{}(piece) % cache_shards];
  }

  void load(const json& j);
  void encode(std::string_view text, encode_mode mode, std::vector<token_id>& out) const;
  void encode_added(std::string_view text, encode_mode mode, const trie& t, bool first_pass,
                    std::vector<token_id>& out) const;
  void pre_tokenize_and_bpe(std::string_view text, std::vector<token_id>& out) const;
  void bpe(std::string_view piece, std::vector<token_id>& out) const;
};

void tokenizer::impl::load(const json& j) {
  // normalizer: none, or an empty Sequence.
  if (const auto& n = j.at("normalizer"); !n.is_null()) {
    if (n.at("type") != "Sequence" || !n.at("normalizers").empty())
      unsupported("normalizer " + n.dump());
  }
  // pre_tokenizer: Sequence[Split digits, Split CJK, Split main, ByteLevel(no prefix, no regex)].
  {
    const auto& p = j.at("pre_tokenizer");
    const auto split_ok = [](const json& s, std::string_view re) {
      return s.value("type", "") == "Split" && s.contains("pattern") &&
             s["pattern"].contains("Regex") && s["pattern"]["Regex"] == re &&
             s.value("behavior", "") == "Isolated" && !s.value("invert", false);
    };
    bool ok = p.value("type", "") == "Sequence" && p.at("pretokenizers").size() == 4;
    if (ok) {
      const auto& s = p["pretokenizers"];
      ok = split_ok(s[0], re_digits) && split_ok(s[1], re_cjk) && split_ok(s[2], re_main) &&
           s[3].value("type", "") == "ByteLevel" && !s[3].value("add_prefix_space", true) &&
           !s[3].value("use_regex", true);
    }
    if (!ok) unsupported("pre_tokenizer " + p.dump().substr(0, 400));
  }
  // post_processor: ByteLevel (offsets only; adds no token) or none.
  if (const auto& pp = j.at("post_processor"); !pp.is_null() && pp.value("type", "") != "ByteLevel")
    unsupported("post_processor " + pp.dump());
  if (const auto& d = j.at("decoder"); d.value("type", "") != "ByteLevel")
    unsupported("decoder " + d.dump());

  const auto& m = j.at("model");
  if (m.value("type", "") != "BPE") unsupported("model type");
  if (!m.value("dropout", json()).is_null()) unsupported("BPE dropout");
  if (!m.value("continuing_subword_prefix", json()).is_null() ||
      !m.value("end_of_word_suffix", json()).is_null())
    unsupported("BPE subword prefix / suffix");
  if (m.value("byte_fallback", false)) unsupported("BPE byte_fallback");
  if (m.value("ignore_merges", false)) unsupported("BPE ignore_merges");

  token_id max_id = 0;
  for (const auto& [tok, id] : m.at("vocab").items()) {
    vocab.emplace(tok, id.get<token_id>());
    max_id = std::max(max_id, id.get<token_id>());
  }
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, bytes().to_char[b]);
    const auto it = vocab.find(s);
    if (it == vocab.end()) unsupported("vocabulary without byte " + std::to_string(b));
    byte_id[b] = it->second;
  }
  const auto& ms = m.at("merges");
  merges.reserve(ms.size() * 2);
  std::uint32_t rank = 0;
  for (const auto& e : ms) {
    std::string a, b;
    if (e.is_string()) {
      const auto s = e.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        unsupported("merge '" + s + "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      a = e.at(0).get<std::string>();
      b = e.at(1).get<std::string>();
    }
    const auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || ic == vocab.end())
      unsupported("merge of tokens missing from the vocabulary: " + a + " " + b);
    merges.insert_or_assign((std::uint64_t{ia->second} << 32) | ib->second, merge{rank, ic->second});
    ++rank;
  }

  for (const auto& a : j.at("added_tokens")) {
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
      unsupported("added token lstrip / rstrip / single_word");
    added_token t{a.at("content").get<std::string>(), a.at("id").get<token_id>(),
                  a.value("special", false), a.value("normalized", !a.value("special", false))};
    max_id = std::max(max_id, t.id);
    added.push_back(t);
  }
  decoded.assign(max_id + 1, {});
  id_kind.assign(max_id + 1, 0);
  for (const auto& [tok, id] : vocab) {
    auto b = byte_level_to_bytes(tok);
    decoded[id] = b ? *b : tok;
    id_kind[id] = 1;
  }
  for (std::size_t i = 0; i < added.size(); ++i) {
    const auto& t = added[i];
    added_by_content[t.content] = t.id;
    (t.normalized ? normalized_trie : raw_trie).insert(t.content, static_cast<int>(i));
    auto b = byte_level_to_bytes(t.content);
    decoded[t.id] = b ? *b : t.content;
    id_kind[t.id] = t.special ? 3 : 2;
  }
}

void tokenizer::impl::bpe(std::string_view piece, std::vector<token_id>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  cache_shard& cached = shard(piece);
  {
    std::lock_guard lock(cached.mutex);
    if (const auto it = cached.pieces.find(piece); it != cached.pieces.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  struct symbol {
    token_id id;
    int prev, next;
    bool alive;
  };
  struct item {
    std::uint32_t rank;
    int pos;
    token_id id;
    bool operator>(const item& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int n = static_cast<int>(piece.size());
  std::vector<symbol> sym(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    sym[static_cast<std::size_t>(i)] = {byte_id[static_cast<unsigned char>(piece[static_cast<std::size_t>(i)])],
                                        i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<item, std::vector<item>, std::greater<>> heap;
  const auto find = [&](token_id a, token_id b) -> const merge* {
    const auto it = merges.find((std::uint64_t{a} << 32) | b);
    return it == merges.end() ? nullptr : &it->second;
  };
  for (int i = 0; i + 1 < n; ++i)
    if (const auto* m = find(sym[static_cast<std::size_t>(i)].id, sym[static_cast<std::size_t>(i + 1)].id))
      heap.push({m->rank, i, m->id});
  while (!heap.empty()) {
    const item top = heap.top();
    heap.pop();
    auto& s = sym[static_cast<std::size_t>(top.pos)];
    if (!s.alive || s.next < 0) continue;
    auto& r = sym[static_cast<std::size_t>(s.next)];
    const auto* m = find(s.id, r.id);
    if (!m || m->id != top.id) continue;
    s.id = top.id;
    r.alive = false;
    s.next = r.next;
    if (s.next >= 0) sym[static_cast<std::size_t>(s.next)].prev = top.pos;
    if (s.prev >= 0)
      if (const auto* pm = find(sym[static_cast<std::size_t>(s.prev)].id, s.id))
        heap.push({pm->rank, s.prev, pm->id});
    if (s.next >= 0)
      if (const auto* nm = find(s.id, sym[static_cast<std::size_t>(s.next)].id))
        heap.push({nm->rank, top.pos, nm->id});
  }
  const std::size_t start = out.size();
  for (int i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) out.push_back(sym[static_cast<std::size_t>(i)].id);
  std::lock_guard lock(cached.mutex);
  if (cached.pieces.size() >= cache_capacity) cached.pieces.clear();
  cached.pieces.emplace(std::string(piece),
                        std::vector<token_id>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
}

void tokenizer::impl::pre_tokenize_and_bpe(std::string_view text, std::vector<token_id>& out) const {
  if (text.empty()) return;
  // Code points: byte offsets (with the end) and classes.
  thread_local std::vector<std::uint32_t> off;
  thread_local std::vector<std::uint16_t> cls;
  off.clear();
  cls.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t cp;
    const int r = utf8_next(p + i, text.size() - i, cp);  // text is valid UTF-8 here
    off.push_back(static_cast<std::uint32_t>(i));
    cls.push_back(char_class(cp));
    i += static_cast<std::size_t>(r);
  }
  off.push_back(static_cast<std::uint32_t>(text.size()));
  const std::uint16_t* m = cls.data();

  // Split with behaviour Isolated: matches and the gaps between them are pieces.
  const auto split = [](std::size_t a, std::size_t b, auto&& match, auto&& emit) {
    std::size_t gap = a, i = a;
    while (i < b) {
      const std::size_t e = match(i, b);
      if (e > i) {
        if (gap < i) emit(gap, i);
        emit(i, e);
        i = gap = e;
      } else {
        ++i;
      }
    }
    if (gap < b) emit(gap, b);
  };
  const auto run = [m](std::size_t i, std::size_t b, std::uint16_t mask) {
    while (i < b && (m[i] & mask)) ++i;
    return i;
  };
  // \p{N}{1,3}
  const auto match_digits = [&](std::size_t i, std::size_t b) -> std::size_t {
    if (!(m[i] & c_n)) return 0;
    std::size_t j = i + 1;
    while (j < b && j < i + 3 && (m[j] & c_n)) ++j;
    return j;
  };
  const auto match_cjk = [&](std::size_t i, std::size_t b) -> std::size_t {
    return (m[i] & c_cjk) ? run(i + 1, b, c_cjk) : 0;
  };
  const auto match_main = [&](std::size_t i, std::size_t b) -> std::size_t {
    const std::uint16_t c = m[i];
    // [!"#...~][A-Za-z]+
    if (c & c_apunct) {
      const std::size_t j = run(i + 1, b, c_alpha);
      if (j > i + 1) return j;
    }
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
    if (!(c & (c_crlf | c_l | c_p | c_s)) && i + 1 < b && (m[i + 1] & (c_l | c_m)))
      return run(i + 2, b, c_l | c_m);
    if (c & (c_l | c_m)) return run(i + 1, b, c_l | c_m);
    // ' ?[\p{P}\p{S}]+[\r\n]*'
    {
      std::size_t j = i;
      if ((c & c_space) && i + 1 < b && (m[i + 1] & (c_p | c_s))) ++j;
      if (m[j] & (c_p | c_s)) return run(run(j + 1, b, c_p | c_s), b, c_crlf);
    }
    if (c & c_ws) {
      std::size_t j = i, last = b;
      while (j < b && (m[j] & c_ws)) {
        if (m[j] & c_crlf) last = j;
        ++j;
      }
      if (last != b) return last + 1;  // \s*[\r\n]+
      if (j == b) return j;            // \s+(?!\S) at the end
      if (j - 1 > i) return j - 1;     // \s+(?!\S), backtracked by one
      return j;                        // \s+
    }
    return 0;
  };
  const auto emit_piece = [&](std::size_t a, std::size_t b) {
    bpe(text.substr(off[a], off[b] - off[a]), out);
  };
  const auto emit_main = [&](std::size_t a, std::size_t b) { split(a, b, match_main, emit_piece); };
  const auto emit_cjk = [&](std::size_t a, std::size_t b) { split(a, b, match_cjk, emit_main); };
  split(0, cls.size(), match_digits, emit_cjk);
}

void tokenizer::impl::encode_added(std::string_view text, encode_mode mode, const trie& t,
                                   bool first_pass, std::vector<token_id>& out) const {
  const auto rest = [&](std::string_view s) {
    if (s.empty()) return;
    if (first_pass)
      encode_added(s, mode, normalized_trie, false, out);
    else
      pre_tokenize_and_bpe(s, out);
  };
  if (t.empty()) {
    rest(text);
    return;
  }
  std::size_t gap = 0, i = 0;
  while (i < text.size()) {
    if (!t.first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const auto [len, value] = t.longest_at(text, i);
    if (len == 0) {
      ++i;
      continue;
    }
    const auto& a = added[static_cast<std::size_t>(value)];
    if (mode == encode_mode::plain && a.special) {  // found, then skipped: stays text
      i += len;
      continue;
    }
    rest(text.substr(gap, i - gap));
    out.push_back(a.id);
    i += len;
    gap = i;
  }
  rest(text.substr(gap));
}

void tokenizer::impl::encode(std::string_view text, encode_mode mode, std::vector<token_id>& out) const {
  std::string clean;
  if (!valid_utf8(text)) {
    sanitize_into(text, clean, true);
    text = clean;
  }
  if (mode == encode_mode::raw)
    pre_tokenize_and_bpe(text, out);
  else
    encode_added(text, mode, raw_trie, true, out);
}

// ---------------------------------------------------------------- tokenizer

tokenizer::tokenizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

tokenizer tokenizer::from_json(std::string_view json_text) {
  auto p = std::make_unique<impl>();
  p->load(json::parse(json_text));
  return tokenizer(std::move(p));
}

tokenizer tokenizer::from_file(const std::filesystem::path& path) {
  return from_json(read_file(path));
}

std::vector<token_id> tokenizer::encode(std::string_view text, encode_mode mode) const {
  std::vector<token_id> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, mode, out);
  return out;
}

void tokenizer::encode(std::string_view text, encode_mode mode, std::vector<token_id>& out) const {
  impl_->encode(text, mode, out);
}

std::string tokenizer::decode_bytes(std::span<const token_id> ids, bool skip_special) const {
  std::string out;
  for (const token_id id : ids) {
    if (id >= impl_->id_kind.size() || impl_->id_kind[id] == 0) continue;
    if (skip_special && impl_->id_kind[id] == 3) continue;
    out += impl_->decoded[id];
  }
  return out;
}

std::string tokenizer::decode(std::span<const token_id> ids, bool skip_special) const {
  return utf8_sanitize(decode_bytes(ids, skip_special));
}

std::size_t tokenizer::vocab_size() const { return impl_->id_kind.size(); }

bool tokenizer::is_special(token_id id) const {
  return id < impl_->id_kind.size() && impl_->id_kind[id] == 3;
}

bool tokenizer::is_added(token_id id) const {
  return id < impl_->id_kind.size() && impl_->id_kind[id] >= 2;
}

std::optional<token_id> tokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end())
    return it->second;
  if (const auto it = impl_->vocab.find(std::string(token)); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  sanitize_into(s, out, true);
  return out;
}

// ---------------------------------------------------------------- incremental detokenizer

incremental_detokenizer::incremental_detokenizer(const tokenizer& t, bool skip_special)
    : tok_(&t), skip_special_(skip_special) {}

std::string incremental_detokenizer::take_complete(bool final) {
  std::string out;
  const std::size_t used = sanitize_into(pending_, out, final);
  pending_.erase(0, used);
  return out;
}

std::string incremental_detokenizer::push(token_id id) {
  pending_ += tok_->decode_bytes(std::span<const token_id>(&id, 1), skip_special_);
  return take_complete(false);
}

std::string incremental_detokenizer::push(std::span<const token_id> ids) {
  pending_ += tok_->decode_bytes(ids, skip_special_);
  return take_complete(false);
}

std::string incremental_detokenizer::flush() { return take_complete(true); }

}  // namespace troupe::recipe

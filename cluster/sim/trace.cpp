// Request traces: the Mooncake and Azure readers, the block-key scheme, the hit-rate replay.
#include "cluster/sim/trace.hpp"

#include "runtime/check.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <unordered_set>

namespace troupe::cluster::sim {

namespace {

// fmix64 from MurmurHash3: a bijection on 64-bit integers with good avalanche.
constexpr std::uint64_t fmix64(std::uint64_t k) noexcept {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

constexpr std::uint64_t max_hash_id = std::uint64_t{1} << 55;

// Seed of the keys of Azure records (which never hit).
constexpr std::uint64_t azure_key_seed = 0x617a7572652d6b76ULL; // "azure-kv"

// Seed of the group keys of prefix_hit_rate at coarser granularities.
constexpr std::uint64_t group_key_seed = 0x67726f75702d6b76ULL; // "group-kv"

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// Converts milliseconds (or any unit given as nanoseconds per unit) to a duration divided by
// the speedup, rounded to the nanosecond.
runtime::duration scaled(long double nanoseconds, double speedup) {
  return runtime::duration{static_cast<std::int64_t>(std::llround(nanoseconds / speedup))};
}

// The first byte of `line` that no text trace holds (a control character other than tab), as
// a message naming it and its column; nullopt for a line of text.
std::optional<std::string> binary_byte(std::string_view line) {
  for (std::size_t i = 0; i < line.size(); ++i) {
    auto c = static_cast<unsigned char>(line[i]);
    if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", c);
      return "binary data (byte " + std::string{hex} + " at column " + std::to_string(i + 1)
             + "): not a text trace";
    }
  }
  return std::nullopt;
}

// The arrival limit's message.
std::string beyond_span(const std::string& what) {
  return what + " is beyond the 7 days a trace may span (docs/traces.md, \"Limits\")";
}

// Shared by both readers: the option checks, and the ordering and limits applied at the end.
class loader {
public:
  loader(std::string_view file, const load_options& options) : file_(file), opt_(options) {
    if (!(options.speedup > 0) || !std::isfinite(options.speedup))
      fail(0, "speedup must be a positive number, got " + std::to_string(options.speedup));
  }

  bool failed() const noexcept { return !result_.ok; }

  // Reports a bad line; in strict mode it also fails the load.
  void bad_line(std::uint32_t line, std::string message) {
    result_.diagnostics.push_back({file_, line, std::move(message)});
    if (opt_.strict)
      result_.ok = false;
  }

  void fail(std::uint32_t line, std::string message) {
    result_.diagnostics.push_back({file_, line, std::move(message)});
    result_.ok = false;
  }

  const load_options& options() const noexcept { return opt_; }

  void add(request_record r) { result_.records.push_back(std::move(r)); }

  std::vector<request_record>& records() { return result_.records; }

  trace_load finish() {
    if (!result_.ok) {
      result_.records.clear();
      return std::move(result_);
    }
    auto& rs = result_.records;
    std::stable_sort(rs.begin(), rs.end(), [](const request_record& a, const request_record& b) {
      return a.arrival < b.arrival;
    });
    if (opt_.max_duration) {
      auto end = std::find_if(rs.begin(), rs.end(), [&](const request_record& r) {
        return r.arrival >= *opt_.max_duration;
      });
      rs.erase(end, rs.end());
    }
    if (opt_.max_records && rs.size() > *opt_.max_records)
      rs.resize(*opt_.max_records);
    return std::move(result_);
  }

private:
  std::string file_;
  load_options opt_;
  trace_load result_;
};

// The message of a nlohmann parse error without its "[json.exception...]" prefix.
std::string json_error(const std::string& what) {
  auto pos = what.find("] ");
  auto message = pos == std::string::npos ? what : what.substr(pos + 2);
  // The parser quotes what it read last, which may be a long run of arbitrary bytes.
  if (message.size() > 160)
    message = message.substr(0, 160) + "...";
  return "invalid JSON: " + message;
}

// An integer field ≥ `min`; an error message naming the key otherwise.
std::optional<std::string> read_count(const nlohmann::json& obj, const char* key,
                                      std::uint64_t min, std::uint64_t& out) {
  auto it = obj.find(key);
  if (it == obj.end())
    return std::string{"missing \""} + key + "\"";
  if (!it->is_number_integer())
    return std::string{"\""} + key + "\" must be an integer, got " + it->dump();
  if (!it->is_number_unsigned() || it->get<std::uint64_t>() < min)
    return std::string{"\""} + key + "\" must be at least " + std::to_string(min) + ", got "
           + it->dump();
  out = it->get<std::uint64_t>();
  return std::nullopt;
}

// Parses one Mooncake line; returns the error message on failure.
std::optional<std::string> parse_mooncake_line(std::string_view line, double speedup,
                                               request_record& r,
                                               std::vector<std::uint64_t>& ids) {
  nlohmann::json obj;
  try {
    obj = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    return json_error(e.what());
  }
  if (!obj.is_object())
    return std::string{"expected a JSON object, got "} + obj.type_name();
  auto ts = obj.find("timestamp");
  if (ts == obj.end())
    return std::string{"missing \"timestamp\""};
  if (!ts->is_number() || !std::isfinite(ts->get<double>()) || ts->get<double>() < 0)
    return "\"timestamp\" must be a number of milliseconds ≥ 0, got " + ts->dump();
  long double ns = ts->is_number_unsigned()
                       ? static_cast<long double>(ts->get<std::uint64_t>()) * 1'000'000.0L
                       : static_cast<long double>(ts->get<double>()) * 1'000'000.0L;
  if (ns / speedup > static_cast<long double>(max_trace_span.count()))
    return beyond_span("\"timestamp\" " + ts->dump() + " ms"
                       + (speedup != 1.0 ? " (divided by the speedup)" : ""));
  if (auto e = read_count(obj, "input_length", 1, r.input_tokens))
    return e;
  if (auto e = read_count(obj, "output_length", 1, r.output_tokens))
    return e;
  auto hs = obj.find("hash_ids");
  if (hs == obj.end())
    return std::string{"missing \"hash_ids\""};
  if (!hs->is_array())
    return "\"hash_ids\" must be an array, got " + std::string{hs->type_name()};
  ids.clear();
  for (std::size_t i = 0; i < hs->size(); ++i) {
    const auto& h = (*hs)[i];
    if (!h.is_number_unsigned() || h.get<std::uint64_t>() >= max_hash_id)
      return "\"hash_ids\"[" + std::to_string(i) + "] must be an integer in [0, 2^55), got "
             + h.dump();
    ids.push_back(h.get<std::uint64_t>());
  }
  auto want = blocks_for(r.input_tokens, mooncake_block_tokens);
  if (ids.size() != want)
    return "\"hash_ids\" has " + std::to_string(ids.size()) + " ids, but input_length "
           + std::to_string(r.input_tokens) + " needs " + std::to_string(want)
           + " (one per 512 tokens)";
  r.arrival = scaled(ns, speedup);
  r.blocks.clear();
  expand_mooncake_blocks(ids, r.input_tokens, r.blocks);
  return std::nullopt;
}

bool parse_uint(std::string_view s, std::uint64_t& out) {
  if (s.empty())
    return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

// Parses `YYYY-MM-DD HH:MM:SS[.fraction]` (fraction up to 9 digits) into nanoseconds since
// the epoch.
std::optional<std::int64_t> parse_timestamp(std::string_view s) {
  auto num = [&](std::size_t pos, std::size_t len, unsigned lo, unsigned hi,
                 unsigned& out) -> bool {
    std::uint64_t v = 0;
    if (pos + len > s.size() || !parse_uint(s.substr(pos, len), v) || v < lo || v > hi)
      return false;
    out = static_cast<unsigned>(v);
    return true;
  };
  unsigned y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':'
      || s[16] != ':')
    return std::nullopt;
  if (!num(0, 4, 1970, 9999, y) || !num(5, 2, 1, 12, mo) || !num(8, 2, 1, 31, d)
      || !num(11, 2, 0, 23, h) || !num(14, 2, 0, 59, mi) || !num(17, 2, 0, 60, sec))
    return std::nullopt;
  std::int64_t frac_ns = 0;
  if (s.size() > 19) {
    auto frac = s.substr(20);
    if (s[19] != '.' || frac.empty() || frac.size() > 9)
      return std::nullopt;
    std::uint64_t v = 0;
    if (!parse_uint(frac, v))
      return std::nullopt;
    for (auto i = frac.size(); i < 9; ++i)
      v *= 10;
    frac_ns = static_cast<std::int64_t>(v);
  }
  std::int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec;
  return secs * 1'000'000'000 + frac_ns;
}

// Unique keys of an Azure record: XXH3 over (line, block index, block length).
void azure_blocks(std::uint64_t line, std::uint64_t input_tokens,
                  std::vector<std::uint64_t>& out) {
  auto n = blocks_for(input_tokens, block_tokens);
  out.clear();
  out.reserve(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    auto len = std::min<std::uint64_t>(block_tokens, input_tokens - i * block_tokens);
    std::array<std::uint64_t, 3> in{line, i, len};
    out.push_back(XXH3_64bits_withSeed(in.data(), sizeof(in), azure_key_seed));
  }
}

std::ifstream open(const std::filesystem::path& file, trace_load& failure) {
  std::ifstream in{file, std::ios::binary};
  if (!in) {
    failure.ok = false;
    failure.diagnostics.push_back({file.string(), 0, "cannot open the file"});
  }
  return in;
}

} // namespace

std::string_view to_string(traffic_class c) noexcept {
  return c == traffic_class::agent ? "agent" : "chatbot";
}

std::uint64_t request_record::block_length(std::size_t i) const noexcept {
  if (i + 1 < blocks.size())
    return block_tokens;
  return input_tokens - static_cast<std::uint64_t>(i) * block_tokens;
}

std::uint64_t mooncake_block_key(std::uint64_t hash_id, std::uint32_t sub,
                                 std::uint32_t length) noexcept {
  return fmix64(((hash_id * 4 + sub) * block_tokens) + (length - 1));
}

void expand_mooncake_blocks(const std::vector<std::uint64_t>& hash_ids,
                            std::uint64_t input_tokens, std::vector<std::uint64_t>& out) {
  TROUPE_CHECK(hash_ids.size() == blocks_for(input_tokens, mooncake_block_tokens),
               "one Mooncake hash id per 512 prompt tokens");
  out.reserve(out.size() + blocks_for(input_tokens, block_tokens));
  for (std::size_t i = 0; i < hash_ids.size(); ++i) {
    auto len512 = std::min<std::uint64_t>(mooncake_block_tokens,
                                          input_tokens - i * mooncake_block_tokens);
    for (std::uint32_t sub = 0; sub * block_tokens < len512; ++sub) {
      auto len = std::min<std::uint64_t>(block_tokens, len512 - sub * block_tokens);
      out.push_back(mooncake_block_key(hash_ids[i], sub, static_cast<std::uint32_t>(len)));
    }
  }
}

std::string trace_diagnostic::to_string() const {
  if (line == 0)
    return file + ": " + message;
  return file + ":" + std::to_string(line) + ": " + message;
}

trace_load parse_mooncake(std::istream& in, std::string_view file_name,
                          const load_options& options) {
  loader ld{file_name, options};
  if (ld.failed())
    return ld.finish();
  std::string line;
  std::uint32_t number = 0;
  std::uint64_t index = 0;
  std::vector<std::uint64_t> ids;
  while (std::getline(in, line)) {
    ++number;
    auto text = trim(line);
    if (text.empty())
      continue;
    if (auto b = binary_byte(text)) {
      ld.fail(number, *b + "; expected Mooncake JSONL, one JSON object per line");
      break;
    }
    request_record r;
    if (auto e = parse_mooncake_line(text, options.speedup, r, ids)) {
      ld.bad_line(number, *e);
      continue;
    }
    r.traffic = options.traffic;
    r.session = index++;
    ld.add(std::move(r));
  }
  return ld.finish();
}

trace_load load_mooncake(const std::filesystem::path& file, const load_options& options) {
  trace_load failure;
  auto in = open(file, failure);
  if (!failure.ok)
    return failure;
  return parse_mooncake(in, file.string(), options);
}

trace_load parse_azure(std::istream& in, std::string_view file_name,
                       const load_options& options) {
  loader ld{file_name, options};
  if (ld.failed())
    return ld.finish();
  std::string line;
  std::uint32_t number = 0;
  if (!std::getline(in, line) || trim(line) != "TIMESTAMP,ContextTokens,GeneratedTokens") {
    if (auto b = binary_byte(line))
      ld.fail(1, *b + "; expected an Azure CSV trace");
    else
      ld.fail(1, "expected the header \"TIMESTAMP,ContextTokens,GeneratedTokens\", got \""
                     + std::string{trim(line).substr(0, 80)} + "\"");
    return ld.finish();
  }
  number = 1;
  std::vector<std::int64_t> stamps; // absolute ns, parallel to the records
  std::vector<std::uint32_t> lines;  // their line numbers
  std::uint64_t index = 0;
  while (std::getline(in, line)) {
    ++number;
    auto text = trim(line);
    if (text.empty())
      continue;
    if (auto b = binary_byte(text)) {
      ld.fail(number, *b + "; expected an Azure CSV trace");
      break;
    }
    std::array<std::string_view, 3> f;
    std::size_t count = 0;
    for (std::string_view rest = text;; ++count) {
      auto comma = rest.find(',');
      if (count < f.size())
        f[count] = trim(rest.substr(0, comma));
      if (comma == std::string_view::npos) {
        ++count;
        break;
      }
      rest.remove_prefix(comma + 1);
    }
    if (count != 3) {
      ld.bad_line(number, "expected 3 comma-separated fields, got " + std::to_string(count));
      continue;
    }
    auto ts = parse_timestamp(f[0]);
    if (!ts) {
      ld.bad_line(number, "TIMESTAMP must be \"YYYY-MM-DD HH:MM:SS[.fraction]\", got \""
                              + std::string{f[0]} + "\"");
      continue;
    }
    request_record r;
    if (!parse_uint(f[1], r.input_tokens) || r.input_tokens == 0) {
      ld.bad_line(number, "ContextTokens must be an integer ≥ 1, got \"" + std::string{f[1]}
                              + "\"");
      continue;
    }
    if (!parse_uint(f[2], r.output_tokens) || r.output_tokens == 0) {
      ld.bad_line(number, "GeneratedTokens must be an integer ≥ 1, got \""
                              + std::string{f[2]} + "\"");
      continue;
    }
    azure_blocks(number, r.input_tokens, r.blocks);
    r.traffic = options.traffic;
    r.session = index++;
    stamps.push_back(*ts);
    lines.push_back(number);
    ld.add(std::move(r));
  }
  if (!stamps.empty() && !ld.failed()) {
    auto start = *std::min_element(stamps.begin(), stamps.end());
    auto& rs = ld.records();
    std::vector<request_record> kept;
    for (std::size_t i = 0; i < rs.size(); ++i) {
      rs[i].arrival = scaled(static_cast<long double>(stamps[i] - start), options.speedup);
      if (rs[i].arrival > max_trace_span)
        ld.bad_line(lines[i], beyond_span("TIMESTAMP, "
                                          + std::to_string(runtime::to_seconds(rs[i].arrival))
                                          + " s after the first,"));
      else
        kept.push_back(std::move(rs[i]));
    }
    rs = std::move(kept);
  }
  return ld.finish();
}

trace_load load_azure(const std::filesystem::path& file, const load_options& options) {
  trace_load failure;
  auto in = open(file, failure);
  if (!failure.ok)
    return failure;
  return parse_azure(in, file.string(), options);
}

trace_load load_trace(const std::filesystem::path& file, const load_options& options) {
  auto ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".jsonl")
    return load_mooncake(file, options);
  if (ext == ".csv")
    return load_azure(file, options);
  trace_load failure;
  failure.ok = false;
  failure.diagnostics.push_back(
    {file.string(), 0,
     "unknown trace format \"" + ext + "\": expected .jsonl (Mooncake) or .csv (Azure)"});
  return failure;
}

double hit_rate::block_rate() const noexcept {
  return blocks == 0 ? 0.0 : static_cast<double>(hit_blocks) / static_cast<double>(blocks);
}

double hit_rate::token_rate() const noexcept {
  return tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / static_cast<double>(tokens);
}

hit_rate prefix_hit_rate(const std::vector<request_record>& records,
                         std::uint32_t granularity) {
  TROUPE_CHECK(granularity > 0 && granularity % block_tokens == 0,
               "the hit-rate granularity must be a positive multiple of 128 tokens");
  const std::size_t group = granularity / block_tokens;
  hit_rate out;
  std::unordered_set<std::uint64_t> cache;
  std::vector<std::uint64_t> keys;
  std::vector<std::uint64_t> lengths;
  for (const auto& r : records) {
    keys.clear();
    lengths.clear();
    for (std::size_t i = 0; i < r.blocks.size(); i += group) {
      auto n = std::min(group, r.blocks.size() - i);
      keys.push_back(group == 1 ? r.blocks[i]
                                : XXH3_64bits_withSeed(r.blocks.data() + i,
                                                       n * sizeof(std::uint64_t),
                                                       group_key_seed));
      std::uint64_t len = 0;
      for (std::size_t j = i; j < i + n; ++j)
        len += r.block_length(j);
      lengths.push_back(len);
    }
    bool hitting = true;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      hitting = hitting && cache.contains(keys[k]);
      out.blocks += 1;
      out.tokens += lengths[k];
      if (hitting) {
        out.hit_blocks += 1;
        out.hit_tokens += lengths[k];
      }
    }
    cache.insert(keys.begin(), keys.end());
  }
  return out;
}

} // namespace troupe::cluster::sim

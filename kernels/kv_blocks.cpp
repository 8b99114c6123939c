#include "kernels/kv_blocks.hpp"

#include "kernels/byte_io.hpp"

#include <xxhash.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

namespace troupe::kernels {

static_assert(std::endian::native == std::endian::little,
              "the KV byte formats are written in the host's (little-endian) order");

namespace {

using i64 = std::int64_t;
std::size_t sz(i64 v) { return static_cast<std::size_t>(v); }

constexpr std::uint32_t format_version = 1;
constexpr std::string_view block_magic = "TKVB", state_magic = "TKVS", swa_magic = "TKVW",
                           draft_magic = "TKVD";
constexpr std::size_t frame_header = 16, frame_trailer = 8;

// How a tensor's values are stored.
enum encoding : std::uint8_t {
  raw_f32 = 0,     // 4 bytes per value
  fp4_e4m3x16 = 1,  // per 16 values: an e4m3 scale byte, then 8 bytes of e2m1 codes
  fp4_pow2x32 = 2,  // per 32 values: a power-of-two exponent (int8), then 16 bytes of codes
};

i64 group_of(encoding e) { return e == fp4_e4m3x16 ? 16 : 32; }

constexpr std::array<float, 8> e2m1 = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// The positive finite e4m3fn values by byte (0x00 .. 0x7e).
const std::array<float, 127>& e4m3_values() {
  static const auto table = [] {
    std::array<float, 127> t{};
    for (int b = 0; b < 127; ++b) {
      const int exp = b >> 3, mant = b & 7;
      t[sz(b)] = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)
                          : std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
    }
    return t;
  }();
  return table;
}

float decode_scale(encoding e, std::uint8_t byte) {
  return e == fp4_e4m3x16 ? e4m3_values()[byte & 0x7f]
                          : std::ldexp(1.0f, static_cast<int>(static_cast<std::int8_t>(byte)));
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

float decode_fp4(std::uint8_t code, float scale) {
  const float m = e2m1[code & 7] * scale;
  return (code & 8) != 0 ? -m : m;
}

// The scale byte and codes that reproduce v[0..n) bit for bit, if there are any.
bool pack_group(encoding e, const float* v, i64 n, std::uint8_t& scale_byte,
                std::vector<std::uint8_t>& codes) {
  float amax = 0.0f;
  for (i64 i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  std::vector<float> candidates;
  if (amax == 0.0f)
    candidates.push_back(1.0f);
  else
    for (int c = 7; c >= 1; --c) candidates.push_back(amax / e2m1[sz(c)]);
  for (float s : candidates) {
    if (e == fp4_e4m3x16) {
      const auto& t = e4m3_values();
      const auto it = std::find(t.begin(), t.end(), s);
      if (it == t.end()) continue;
      scale_byte = static_cast<std::uint8_t>(it - t.begin());
    } else {
      int exp = 0;
      if (std::frexp(s, &exp) != 0.5f || exp - 1 < -128 || exp - 1 > 127) continue;
      scale_byte = static_cast<std::uint8_t>(static_cast<std::int8_t>(exp - 1));
    }
    const float scale = decode_scale(e, scale_byte);
    codes.assign(sz(n), 0);
    bool ok = true;
    for (i64 i = 0; i < n && ok; ++i) {
      const float q = std::fabs(v[i] / scale);
      const auto it = std::find(e2m1.begin(), e2m1.end(), q);
      if (it == e2m1.end()) {
        ok = false;
        break;
      }
      auto code = static_cast<std::uint8_t>(it - e2m1.begin());
      if (std::signbit(v[i])) code |= 8;
      codes[sz(i)] = code;
      ok = same_bits(decode_fp4(code, scale), v[i]);
    }
    if (ok) return true;
  }
  return false;
}

class writer : public byte_writer {
 public:
  void put_floats(const float* v, i64 n) { put_bytes(v, sz(n) * sizeof(float)); }
  void put_floats(const std::vector<float>& v) {
    put<std::uint64_t>(v.size());
    put_floats(v.data(), static_cast<i64>(v.size()));
  }
  // Rows [first, first + rows) of `p`, packed as `preferred` when every group packs exactly.
  // `rows` adjacent rows of width w from `at`.
  void put_rows(const float* at, i64 rows, i64 w, encoding preferred) {
    const i64 g = group_of(preferred);
    std::string packed;
    bool ok = w % g == 0;
    std::uint8_t scale = 0;
    std::vector<std::uint8_t> codes;
    for (i64 r = 0; r < rows && ok; ++r)
      for (i64 b = 0; b < w / g && ok; ++b) {
        ok = pack_group(preferred, at + r * w + b * g, g, scale, codes);
        if (!ok) break;
        packed.push_back(static_cast<char>(scale));
        for (i64 i = 0; i < g; i += 2)
          packed.push_back(static_cast<char>(codes[sz(i)] | (codes[sz(i + 1)] << 4)));
      }
    if (ok) {
      put<std::uint8_t>(preferred);
      out_ += packed;
    } else {
      put<std::uint8_t>(raw_f32);
      put_floats(at, rows * w);
    }
  }
  // The frame around the payload written so far.
  std::string frame(std::string_view magic) const {
    std::string f(magic);
    const std::uint32_t version = format_version;
    const std::uint64_t size = out_.size();
    f.append(reinterpret_cast<const char*>(&version), sizeof version);
    f.append(reinterpret_cast<const char*>(&size), sizeof size);
    f += out_;
    const std::uint64_t h = XXH3_64bits(f.data(), f.size());
    f.append(reinterpret_cast<const char*>(&h), sizeof h);
    return f;
  }
};

class reader : public byte_reader {
 public:
  using byte_reader::byte_reader;
  bool get_floats(float* v, i64 n) { return n >= 0 && get_bytes(v, sz(n) * sizeof(float)); }
  bool get_floats(std::vector<float>& v, std::uint64_t limit) {
    std::uint64_t n = 0;
    if (!get(n) || n > limit || n * sizeof(float) > in_.size()) return false;
    v.resize(n);
    return get_floats(v.data(), static_cast<i64>(n));
  }
  // `rows` rows of `width` values, as put_rows wrote them.
  bool get_rows(i64 rows, i64 width, std::vector<float>& out) {
    std::uint8_t e = 0;
    if (!get(e)) return false;
    out.resize(sz(rows * width));
    if (e == raw_f32) return get_floats(out.data(), rows * width);
    if (e != fp4_e4m3x16 && e != fp4_pow2x32) return false;
    const auto enc = static_cast<encoding>(e);
    const i64 g = group_of(enc);
    if (width % g != 0) return false;
    for (i64 b = 0; b < rows * width / g; ++b) {
      std::uint8_t scale_byte = 0;
      if (!get(scale_byte)) return false;
      if (enc == fp4_e4m3x16 && (scale_byte & 0x7f) == 0x7f) return false;  // NaN
      const float scale = decode_scale(enc, scale_byte);
      for (i64 i = 0; i < g; i += 2) {
        std::uint8_t two = 0;
        if (!get(two)) return false;
        out[sz(b * g + i)] = decode_fp4(two & 0x0f, scale);
        out[sz(b * g + i + 1)] = decode_fp4(two >> 4, scale);
      }
    }
    return true;
  }
};

// The payload of a framed string, or why there is none.
result<std::string_view> unframe(std::string_view bytes, std::string_view magic,
                                 std::string_view what) {
  using fail = result<std::string_view>;
  if (bytes.size() < frame_header + frame_trailer)
    return fail::failure(std::string(what) + ": " + std::to_string(bytes.size()) +
                         " bytes, shorter than the frame");
  if (bytes.substr(0, 4) != magic)
    return fail::failure(std::string(what) + ": not a " + std::string(what) + " string (magic)");
  std::uint32_t version = 0;
  std::uint64_t size = 0;
  std::memcpy(&version, bytes.data() + 4, sizeof version);
  std::memcpy(&size, bytes.data() + 8, sizeof size);
  if (version != format_version)
    return fail::failure(std::string(what) + ": format version " + std::to_string(version) +
                         ", expected " + std::to_string(format_version));
  if (size != bytes.size() - frame_header - frame_trailer)
    return fail::failure(std::string(what) + ": payload of " + std::to_string(size) +
                         " bytes announced, " +
                         std::to_string(bytes.size() - frame_header - frame_trailer) +
                         " present (truncated?)");
  std::uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - frame_trailer, sizeof stored);
  if (XXH3_64bits(bytes.data(), bytes.size() - frame_trailer) != stored)
    return fail::failure(std::string(what) + ": checksum mismatch (corrupt bytes)");
  return bytes.substr(frame_header, size);
}

i64 rows_in_block(const layer_cache& l) { return l.compressed.kv.rows_per_block(); }

}  // namespace

std::int64_t full_blocks(const sequence_cache& s) {
  i64 blocks = -1;
  for (const auto& l : s.layers) {
    if (!l.is_kv_source) continue;
    const i64 b = l.compressed.kv.size() / rows_in_block(l);
    blocks = blocks < 0 ? b : std::min(blocks, b);
  }
  return std::max<i64>(0, blocks);
}

result<std::string> serialize_block(const sequence_cache& s, std::int64_t block) {
  if (block < 0 || block >= full_blocks(s))
    return result<std::string>::failure("serialize_block: block " + std::to_string(block) +
                                        " is not full (" + std::to_string(full_blocks(s)) +
                                        " full blocks)");
  // A block's rows are adjacent in a paged store.
  std::vector<block_layer_rows> layers;
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    const auto& l = s.layers[i];
    if (!l.is_kv_source) continue;
    const auto& c = l.compressed;
    const i64 rows = rows_in_block(l), first = block * rows;
    const bool keys = c.index_keys.size() > first;
    layers.push_back({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(c.ratio), rows,
                      c.kv.width(), keys ? c.index_keys.width() : 0, c.kv.row(first),
                      keys ? c.index_keys.row(first) : nullptr});
  }
  return serialize_block_rows(block, layers);
}

std::string serialize_block_rows(std::int64_t block, std::span<const block_layer_rows> layers) {
  writer w;
  w.put<std::uint64_t>(static_cast<std::uint64_t>(block));
  w.put(static_cast<std::uint32_t>(layers.size()));
  for (const auto& l : layers) {
    w.put(l.layer);
    w.put(l.ratio);
    w.put(static_cast<std::uint32_t>(l.rows));
    w.put(static_cast<std::uint32_t>(l.width));
    w.put(static_cast<std::uint32_t>(l.key_width));
    w.put_rows(l.kv, l.rows, l.width, fp4_e4m3x16);
    if (l.key_width > 0) w.put_rows(l.keys, l.rows, l.key_width, fp4_pow2x32);
  }
  return w.frame(block_magic);
}

result<bool> restore_block(sequence_cache& s, std::int64_t block, std::string_view bytes) {
  auto fail = [](const std::string& m) { return result<bool>::failure("restore_block: " + m); };
  auto payload = unframe(bytes, block_magic, "Block KV");
  if (!payload) return fail(payload.error());
  reader r(*payload);
  std::uint64_t index = 0;
  std::uint32_t sources = 0;
  if (!r.get(index) || !r.get(sources)) return fail("truncated header");
  if (index != static_cast<std::uint64_t>(block))
    return fail("the bytes hold block " + std::to_string(index) + ", expected " +
                std::to_string(block));
  struct decoded {
    std::size_t layer;
    std::vector<float> kv, keys;
  };
  std::vector<decoded> layers;
  std::uint32_t expected_sources = 0;
  for (const auto& l : s.layers) expected_sources += l.is_kv_source ? 1 : 0;
  if (sources != expected_sources)
    return fail(std::to_string(sources) + " KV-source layers, the cache has " +
                std::to_string(expected_sources));
  for (std::uint32_t k = 0; k < sources; ++k) {
    std::uint32_t layer = 0, ratio = 0, rows = 0, width = 0, key_width = 0;
    if (!r.get(layer) || !r.get(ratio) || !r.get(rows) || !r.get(width) || !r.get(key_width))
      return fail("truncated layer header");
    if (layer >= s.layers.size() || !s.layers[layer].is_kv_source)
      return fail("layer " + std::to_string(layer) + " is not a KV source of this cache");
    if (!layers.empty() && layer <= layers.back().layer)
      return fail("layer " + std::to_string(layer) + " out of order");
    const auto& c = s.layers[layer].compressed;
    const i64 want_rows = rows_in_block(s.layers[layer]);
    if (ratio != c.ratio || rows != want_rows || width != c.kv.width() ||
        (key_width != 0 && key_width != c.index_keys.width()))
      return fail("layer " + std::to_string(layer) + ": ratio " + std::to_string(ratio) + ", " +
                  std::to_string(rows) + " rows of " + std::to_string(width) + " (keys " +
                  std::to_string(key_width) + "), expected ratio " + std::to_string(c.ratio) +
                  ", " + std::to_string(want_rows) + " rows of " + std::to_string(c.kv.width()) +
                  " (keys " + std::to_string(c.index_keys.width()) + ")");
    if (c.kv.size() != block * want_rows ||
        (c.index_keys.size() != (key_width != 0 ? block * want_rows : 0)))
      return fail("layer " + std::to_string(layer) + " holds " + std::to_string(c.kv.size()) +
                  " rows and " + std::to_string(c.index_keys.size()) + " keys, expected " +
                  std::to_string(block) + " full blocks before this one");
    decoded d{layer, {}, {}};
    if (!r.get_rows(rows, width, d.kv))
      return fail("layer " + std::to_string(layer) + ": bad KV rows");
    if (key_width != 0 && !r.get_rows(rows, key_width, d.keys))
      return fail("layer " + std::to_string(layer) + ": bad indexer key rows");
    layers.push_back(std::move(d));
  }
  if (!r.done()) return fail("trailing bytes after the last layer");
  for (const auto& d : layers) {
    auto& c = s.layers[d.layer].compressed;
    const i64 w = c.kv.width(), kw = c.index_keys.width();
    for (std::size_t i = 0; i * sz(w) < d.kv.size(); ++i) c.kv.append(d.kv.data() + i * sz(w));
    for (std::size_t i = 0; !d.keys.empty() && i * sz(kw) < d.keys.size(); ++i)
      c.index_keys.append(d.keys.data() + i * sz(kw));
  }
  return true;
}

result<std::string> serialize_state(const sequence_cache& s) {
  writer w;
  w.put<std::int64_t>(s.length);
  w.put<std::int64_t>(s.rollback_floor);
  w.put<std::uint64_t>(s.engram_recent.size());
  for (auto id : s.engram_recent) w.put<std::int64_t>(id);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(s.layers.size()));
  const i64 blocks = full_blocks(s);
  for (const auto& l : s.layers) {
    w.put<std::uint8_t>(l.is_kv_source ? 1 : 0);
    if (!l.is_kv_source) continue;
    const auto& c = l.compressed;
    w.put<std::int64_t>(c.groups);
    w.put<std::int64_t>(c.pending_tokens);
    w.put_floats(c.pending_kv);
    w.put_floats(c.pending_gate);
    w.put<std::int64_t>(c.recent_tokens);
    w.put_floats(c.recent_kv);
    w.put_floats(c.recent_gate);
    // The completed groups of the unfinished block, fp32.
    const i64 first = blocks * rows_in_block(l);
    for (const paged_rows* p : {&c.kv, &c.index_keys}) {
      const i64 rows = std::max<i64>(0, p->size() - first);
      w.put<std::uint64_t>(static_cast<std::uint64_t>(rows));
      for (i64 i = 0; i < rows; ++i) w.put_floats(p->row(first + i), p->width());
    }
  }
  return w.frame(state_magic);
}

result<bool> restore_state(sequence_cache& s, std::string_view bytes) {
  auto fail = [](const std::string& m) { return result<bool>::failure("restore_state: " + m); };
  auto payload = unframe(bytes, state_magic, "State KV");
  if (!payload) return fail(payload.error());
  reader r(*payload);
  std::int64_t length = 0, floor = 0;
  std::uint64_t n_recent = 0;
  if (!r.get(length) || !r.get(floor) || !r.get(n_recent) || n_recent > 4096 || length < 0 ||
      floor < 0 || floor > length)
    return fail("bad header");
  std::vector<std::int64_t> recent(sz(static_cast<i64>(n_recent)));
  for (auto& id : recent)
    if (!r.get(id)) return fail("truncated Engram look-back");
  std::uint32_t n_layers = 0;
  if (!r.get(n_layers) || n_layers != s.layers.size())
    return fail(std::to_string(n_layers) + " layers, the cache has " +
                std::to_string(s.layers.size()));
  const i64 blocks = length / kv_block_tokens;
  std::vector<compressed_cache> next(s.layers.size());
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    std::uint8_t source = 0;
    const auto& l = s.layers[i];
    if (!r.get(source) || (source != 0) != l.is_kv_source)
      return fail("layer " + std::to_string(i) + ": KV-source flag differs from the cache's");
    if (!l.is_kv_source) continue;
    const auto& c = l.compressed;
    const i64 w = c.kv.width(), rows = rows_in_block(l);
    if (c.kv.size() != blocks * rows ||
        (c.index_keys.size() != 0 && c.index_keys.size() != blocks * rows))
      return fail("layer " + std::to_string(i) + " holds " + std::to_string(c.kv.size()) +
                  " rows, expected the " + std::to_string(blocks) +
                  " full blocks of a sequence of " + std::to_string(length) + " tokens");
    auto& n = next[i];
    n = c;  // the full blocks, and the layer's shapes
    const std::uint64_t limit = sz((c.ratio + swa_rollback_tokens) * w);
    if (!r.get(n.groups) || !r.get(n.pending_tokens) || !r.get_floats(n.pending_kv, limit) ||
        !r.get_floats(n.pending_gate, limit) || !r.get(n.recent_tokens) ||
        !r.get_floats(n.recent_kv, limit) || !r.get_floats(n.recent_gate, limit))
      return fail("layer " + std::to_string(i) + ": truncated compressor state");
    const i64 groups = c.ratio > 1 ? length / c.ratio : length;
    const bool gated = c.ratio > 1;
    if (n.groups != groups || n.pending_tokens < 0 || n.recent_tokens < 0 ||
        n.pending_kv.size() != sz(n.pending_tokens * w) ||
        n.pending_gate.size() != (gated ? n.pending_kv.size() : 0) ||
        n.recent_kv.size() != sz(n.recent_tokens * w) ||
        n.recent_gate.size() != (gated ? n.recent_kv.size() : 0))
      return fail("layer " + std::to_string(i) + ": compressor state inconsistent with length " +
                  std::to_string(length));
    for (paged_rows* p : {&n.kv, &n.index_keys}) {
      std::uint64_t extra = 0;
      if (!r.get(extra) || static_cast<i64>(extra) >= rows)
        return fail("layer " + std::to_string(i) + ": bad partial block");
      if (p == &n.index_keys && c.index_keys.size() == 0 && blocks > 0 && extra != 0)
        return fail("layer " + std::to_string(i) + ": indexer keys on a layer without them");
      std::vector<float> row(sz(p->width()));
      for (std::uint64_t k = 0; k < extra; ++k) {
        if (!r.get_floats(row.data(), p->width())) return fail("truncated partial block");
        p->append(row.data());
      }
    }
    if (n.kv.size() != groups || (n.index_keys.size() != 0 && n.index_keys.size() != groups))
      return fail("layer " + std::to_string(i) + ": " + std::to_string(n.kv.size()) +
                  " compressed rows, expected " + std::to_string(groups));
  }
  if (!r.done()) return fail("trailing bytes");
  for (std::size_t i = 0; i < s.layers.size(); ++i)
    if (s.layers[i].is_kv_source) s.layers[i].compressed = std::move(next[i]);
  s.length = length;
  s.rollback_floor = floor;
  s.engram_recent = std::move(recent);
  return true;
}

namespace {

// Window rings (the SWA KV's, a DSpark draft context's): a count, then per ring its positions,
// shape and rows.
void put_rings(writer& w, const std::vector<const swa_ring*>& rings) {
  w.put<std::uint32_t>(static_cast<std::uint32_t>(rings.size()));
  for (const auto* ring : rings) {
    w.put<std::int64_t>(ring->begin());
    w.put<std::int64_t>(ring->end());
    w.put<std::uint32_t>(static_cast<std::uint32_t>(ring->capacity()));
    w.put<std::uint32_t>(static_cast<std::uint32_t>(ring->width()));
    for (i64 p = ring->begin(); p < ring->end(); ++p) w.put_floats(ring->at(p), ring->width());
  }
}

// Rings read back, each of the shape of the matching one of `like`; `what` names a ring in
// errors ("layer", "stage").
result<std::vector<swa_ring>> get_rings(reader& r, const std::vector<const swa_ring*>& like,
                                        const char* what) {
  using fail = result<std::vector<swa_ring>>;
  std::uint32_t n = 0;
  if (!r.get(n) || n != like.size())
    return fail::failure(std::to_string(n) + " " + what + "s, expected " +
                         std::to_string(like.size()));
  std::vector<swa_ring> rings;
  for (std::size_t i = 0; i < like.size(); ++i) {
    const auto& old = *like[i];
    std::int64_t begin = 0, end = 0;
    std::uint32_t capacity = 0, width = 0;
    if (!r.get(begin) || !r.get(end) || !r.get(capacity) || !r.get(width))
      return fail::failure(std::string("truncated ") + what + " header");
    if (capacity != old.capacity() || width != old.width() || begin < 0 || end < begin ||
        end - begin > capacity)
      return fail::failure(std::string(what) + " " + std::to_string(i) + ": ring of " +
                           std::to_string(capacity) + " × " + std::to_string(width) +
                           " holding [" + std::to_string(begin) + ", " + std::to_string(end) +
                           "), expected " + std::to_string(old.capacity()) + " × " +
                           std::to_string(old.width()));
    swa_ring ring(width, capacity);
    ring.reset(begin);
    std::vector<float> row(width);
    for (i64 p = begin; p < end; ++p) {
      if (!r.get_floats(row.data(), width)) return fail::failure("truncated rows");
      ring.push(row.data());
    }
    rings.push_back(std::move(ring));
  }
  if (!r.done()) return fail::failure("trailing bytes");
  return rings;
}

std::vector<const swa_ring*> windows(const sequence_cache& s) {
  std::vector<const swa_ring*> out;
  for (const auto& l : s.layers) out.push_back(&l.window);
  return out;
}

std::vector<const swa_ring*> stages(const draft_state& d) {
  std::vector<const swa_ring*> out;
  for (const auto& r : d.rings) out.push_back(&r);
  return out;
}

}  // namespace

result<std::string> serialize_swa(const sequence_cache& s) {
  writer w;
  put_rings(w, windows(s));
  return w.frame(swa_magic);
}

result<bool> restore_swa(sequence_cache& s, std::string_view bytes) {
  auto fail = [](const std::string& m) { return result<bool>::failure("restore_swa: " + m); };
  auto payload = unframe(bytes, swa_magic, "SWA KV");
  if (!payload) return fail(payload.error());
  reader r(*payload);
  auto rings = get_rings(r, windows(s), "layer");
  if (!rings) return fail(rings.error());
  for (std::size_t i = 0; i < s.layers.size(); ++i) s.layers[i].window = std::move((*rings)[i]);
  return true;
}

std::string serialize_draft(const draft_state& d) {
  writer w;
  put_rings(w, stages(d));
  return w.frame(draft_magic);
}

result<bool> restore_draft(draft_state& d, std::string_view bytes) {
  auto fail = [](const std::string& m) { return result<bool>::failure("restore_draft: " + m); };
  auto payload = unframe(bytes, draft_magic, "DSpark draft context");
  if (!payload) return fail(payload.error());
  reader r(*payload);
  auto rings = get_rings(r, stages(d), "stage");
  if (!rings) return fail(rings.error());
  d.rings = std::move(*rings);
  return true;
}

std::int64_t block_kv_bytes(const text_config& c) {
  i64 bytes = static_cast<i64>(frame_header + frame_trailer) + 8 + 4;
  for (i64 l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_kv_source(l)) continue;
    const i64 r = c.compress_ratios[sz(l)];
    const i64 rows = std::max<i64>(1, kv_block_tokens / std::max<i64>(1, r));
    auto tensor = [&](i64 width, i64 group) {
      return 1 + (width % group == 0 ? rows * (width / group) * (1 + group / 2) : rows * width * 4);
    };
    bytes += 5 * 4 + tensor(c.head_dim, 16);
    if (c.is_index_source(l)) bytes += tensor(c.index_head_dim, 32);
  }
  return bytes;
}

}  // namespace troupe::kernels

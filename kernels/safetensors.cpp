#include "kernels/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/portable_math.hpp"

namespace troupe::kernels {

using nlohmann::json;

namespace {

struct dtype_entry {
  dtype type;
  std::string_view name;
  std::size_t bits;
};
constexpr std::array<dtype_entry, 17> dtype_table{{
    {dtype::BOOL, "BOOL", 8}, {dtype::U8, "U8", 8}, {dtype::I8, "I8", 8},
    {dtype::I16, "I16", 16}, {dtype::U16, "U16", 16}, {dtype::F16, "F16", 16},
    {dtype::BF16, "BF16", 16}, {dtype::I32, "I32", 32}, {dtype::U32, "U32", 32},
    {dtype::F32, "F32", 32}, {dtype::F64, "F64", 64}, {dtype::I64, "I64", 64},
    {dtype::U64, "U64", 64}, {dtype::F8_E4M3, "F8_E4M3", 8}, {dtype::F8_E5M2, "F8_E5M2", 8},
    {dtype::F8_E8M0, "F8_E8M0", 8}, {dtype::F4, "F4", 4},
}};

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string printable_name(std::string_view s) {
  // Names come from untrusted headers: keep messages printable and short.
  std::string out = "'";
  for (char c : s.substr(0, 200)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (s.size() > 200) out += "...";
  return out + "'";
}

template <class T>
T load_le(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and aarch64 hosts are little-endian
  return v;
}

}  // namespace

std::string_view dtype_name(dtype t) {
  for (const auto& e : dtype_table)
    if (e.type == t) return e.name;
  return "?";
}
std::optional<dtype> dtype_from_name(std::string_view name) {
  for (const auto& e : dtype_table)
    if (e.name == name) return e.type;
  return std::nullopt;
}
std::size_t dtype_bits(dtype t) {
  for (const auto& e : dtype_table)
    if (e.type == t) return e.bits;
  return 8;
}

std::uint64_t tensor_info::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

// --- header -----------------------------------------------------------------------------------

result<safetensors_header> parse_safetensors_header(std::span<const std::byte> bytes,
                                                    std::string_view file_view) {
  using R = result<safetensors_header>;
  const std::string file(file_view);
  constexpr std::uint64_t max_header = 100u << 20;  // as the Python library: 100 MB
  if (bytes.size() < 8)
    return R::failure(file + ": truncated: expected at least 8 bytes (the header length), found " +
                      std::to_string(bytes.size()));
  const std::uint64_t n = load_le<std::uint64_t>(bytes.data());
  if (n > max_header)
    return R::failure(file + ": header length " + std::to_string(n) + " exceeds the 100 MiB limit");
  if (n > bytes.size() - 8)
    return R::failure(file + ": truncated: the header needs " + std::to_string(n) + " bytes after the length, the file has " +
                      std::to_string(bytes.size() - 8));
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  json j = json::parse(text, text + n, nullptr, false);
  if (j.is_discarded()) return R::failure(file + ": the header is not valid JSON");
  if (!j.is_object()) return R::failure(file + ": the header is not a JSON object");

  safetensors_header h;
  h.data_start = 8 + n;
  const std::uint64_t data_size = bytes.size() - h.data_start;
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& key = it.key();
      const json& v = it.value();
      if (key == "__metadata__") {
        if (!v.is_object()) return R::failure(file + ": __metadata__ is not an object of strings");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string())
            return R::failure(file + ": __metadata__." + printable_name(m.key()) + " is not a string");
          h.metadata[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string where = file + ": tensor " + printable_name(key);
      if (!v.is_object()) return R::failure(where + ": expected an object with dtype, shape, data_offsets");
      tensor_info t;
      t.name = key;
      auto dt = v.find("dtype");
      if (dt == v.end() || !dt->is_string()) return R::failure(where + ": missing dtype");
      auto type = dtype_from_name(dt->get_ref<const std::string&>());
      if (!type) return R::failure(where + ": unknown dtype " + printable_name(dt->get_ref<const std::string&>()));
      t.type = *type;
      auto sh = v.find("shape");
      if (sh == v.end() || !sh->is_array()) return R::failure(where + ": missing shape");
      // Element count with overflow checks: bytes = numel * bits / 8 must fit in 64 bits.
      std::uint64_t numel = 1;
      bool overflow = false, zero = false;
      for (const json& d : *sh) {
        if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<std::int64_t>() >= 0))
          return R::failure(where + ": shape entries must be non-negative integers");
        std::uint64_t dim = d.get<std::uint64_t>();
        if (dim > std::uint64_t(std::numeric_limits<std::int64_t>::max())) return R::failure(where + ": shape dimension too large");
        if (dim == 0) zero = true;
        else if (numel > std::numeric_limits<std::uint64_t>::max() / 64 / dim) overflow = true;
        if (!overflow) numel *= dim;
        t.shape.push_back(static_cast<std::int64_t>(dim));
      }
      if (zero) numel = 0;
      else if (overflow) return R::failure(where + ": shape " + shape_string(t.shape) + " is too large");
      auto off = v.find("data_offsets");
      if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
          !(*off)[1].is_number_unsigned())
        return R::failure(where + ": data_offsets must be two non-negative integers");
      t.begin = (*off)[0].get<std::uint64_t>();
      t.end = (*off)[1].get<std::uint64_t>();
      if (t.end < t.begin)
        return R::failure(where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
      if (t.end > data_size)
        return R::failure(where + ": data_offsets end at " + std::to_string(t.end) + ", past the data section of " +
                          std::to_string(data_size) + " bytes (truncated file?)");
      const std::size_t bits = dtype_bits(t.type);
      if ((numel * bits) % 8)
        return R::failure(where + ": " + std::to_string(numel) + " elements of " + std::string(dtype_name(t.type)) + " are not a whole number of bytes");
      const std::uint64_t expected = numel * bits / 8;
      if (t.end - t.begin != expected)
        return R::failure(where + ": dtype " + std::string(dtype_name(t.type)) + " and shape " + shape_string(t.shape) + " need " +
                          std::to_string(expected) + " bytes, data_offsets give " + std::to_string(t.end - t.begin));
      const std::uint64_t align = bits >= 8 ? bits / 8 : 1;
      if ((h.data_start + t.begin) % align)
        return R::failure(where + ": data at file offset " + std::to_string(h.data_start + t.begin) + " is not aligned to its " +
                          std::to_string(align) + "-byte elements");
      h.tensors.push_back(std::move(t));
    }
  } catch (const std::exception& e) {  // defensive: a bug here must not escape
    return R::failure(file + ": malformed header: " + e.what());
  }
  // No overlaps and no holes: sorted by offset, each tensor starts where the previous ended.
  std::vector<const tensor_info*> order;
  for (const auto& t : h.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at = 0;
  const tensor_info* prev = nullptr;
  for (const tensor_info* t : order) {
    if (t->begin < at)
      return R::failure(file + ": tensor " + printable_name(t->name) + " [" + std::to_string(t->begin) + ", " + std::to_string(t->end) +
                        ") overlaps tensor " + printable_name(prev->name) + " [" + std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ")");
    if (t->begin > at)
      return R::failure(file + ": bytes [" + std::to_string(at) + ", " + std::to_string(t->begin) + ") of the data section belong to no tensor");
    at = t->end;
    prev = t;
  }
  if (at != data_size)
    return R::failure(file + ": bytes [" + std::to_string(at) + ", " + std::to_string(data_size) +
                      ") at the end of the data section belong to no tensor");
  return h;
}

// --- mapped file -------------------------------------------------------------------------------

struct safetensors_file::impl {
  std::string path;
  void* map = nullptr;
  std::size_t size = 0;
  safetensors_header header;
  std::map<std::string, std::size_t, std::less<>> by_name;

  ~impl() {
    if (map && map != MAP_FAILED) ::munmap(map, size);
  }
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(map), size}; }
};

safetensors_file::safetensors_file(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
safetensors_file::safetensors_file(safetensors_file&&) noexcept = default;
safetensors_file& safetensors_file::operator=(safetensors_file&&) noexcept = default;
safetensors_file::~safetensors_file() = default;

result<safetensors_file> safetensors_file::open(const std::filesystem::path& path) {
  using R = result<safetensors_file>;
  auto p = std::make_unique<impl>();
  p->path = path.string();
  int fd = ::open(p->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return R::failure(p->path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return R::failure(p->path + ": not a regular file");
  }
  p->size = static_cast<std::size_t>(st.st_size);
  if (p->size == 0) {
    ::close(fd);
    return R::failure(p->path + ": truncated: the file is empty");
  }
  p->map = ::mmap(nullptr, p->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p->map == MAP_FAILED) {
    p->map = nullptr;
    return R::failure(p->path + ": mmap failed: " + std::strerror(errno));
  }
  auto h = parse_safetensors_header(p->bytes(), p->path);
  if (!h) return R::failure(h.error());
  p->header = std::move(*h);
  for (std::size_t i = 0; i < p->header.tensors.size(); ++i) p->by_name[p->header.tensors[i].name] = i;
  return safetensors_file(std::move(p));
}

const std::string& safetensors_file::path() const { return impl_->path; }
const safetensors_header& safetensors_file::header() const { return impl_->header; }

std::optional<tensor_view> safetensors_file::find(std::string_view name) const {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return std::nullopt;
  const tensor_info& t = impl_->header.tensors[it->second];
  tensor_view v;
  v.info = &t;
  v.file = &impl_->path;
  v.bytes = impl_->bytes().subspan(impl_->header.data_start + t.begin, t.end - t.begin);
  return v;
}

// --- checkpoint --------------------------------------------------------------------------------

struct checkpoint::impl {
  std::vector<safetensors_file> files;
  std::map<std::string, std::size_t, std::less<>> where;  // tensor -> file index
  std::string description;  // for "not found in ..."
};

checkpoint::checkpoint(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
checkpoint::checkpoint(checkpoint&&) noexcept = default;
checkpoint& checkpoint::operator=(checkpoint&&) noexcept = default;
checkpoint::~checkpoint() = default;

result<checkpoint> checkpoint::open(const std::filesystem::path& path) {
  using R = result<checkpoint>;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path index_path, single_path;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "model.safetensors.index.json", ec)) index_path = path / "model.safetensors.index.json";
    else if (fs::exists(path / "model.safetensors", ec)) single_path = path / "model.safetensors";
    else return R::failure(path.string() + ": neither model.safetensors.index.json nor model.safetensors found");
  } else if (path.extension() == ".json") {
    index_path = path;
  } else {
    single_path = path;
  }
  auto p = std::make_unique<impl>();
  if (!single_path.empty()) {
    auto f = safetensors_file::open(single_path);
    if (!f) return R::failure(f.error());
    for (const auto& t : f->header().tensors) p->where[t.name] = 0;
    p->description = single_path.string();
    p->files.push_back(std::move(*f));
    return checkpoint(std::move(p));
  }
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return R::failure(index_path.string() + ": cannot open the file");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  json j = json::parse(text, nullptr, false);
  const std::string ip = index_path.string();
  if (j.is_discarded()) return R::failure(ip + ": not valid JSON");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return R::failure(ip + ": weight_map: expected an object of tensor name -> shard file, found none");
  std::map<std::string, std::size_t> shard_index;
  const fs::path dir = index_path.parent_path();
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) return R::failure(ip + ": weight_map." + printable_name(it.key()) + ": expected a file name");
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      return R::failure(ip + ": weight_map." + printable_name(it.key()) + ": expected a file name in the same directory, found " + printable_name(shard));
    auto s = shard_index.find(shard);
    if (s == shard_index.end()) {
      auto f = safetensors_file::open(dir / shard);
      if (!f) return R::failure(f.error());
      s = shard_index.emplace(shard, p->files.size()).first;
      p->files.push_back(std::move(*f));
    }
    if (!p->files[s->second].find(it.key()))
      return R::failure(ip + ": weight_map says tensor " + printable_name(it.key()) + " is in " + shard + ", but " +
                        p->files[s->second].path() + " has no such tensor");
    p->where[it.key()] = s->second;
  }
  // A tensor present in a shard but missing from weight_map is an inconsistent checkpoint.
  for (const auto& f : p->files)
    for (const auto& t : f.header().tensors)
      if (!p->where.count(t.name))
        return R::failure(f.path() + ": tensor " + printable_name(t.name) + " is not listed in " + ip);
  p->description = ip + " (" + std::to_string(p->files.size()) + " shards)";
  return checkpoint(std::move(p));
}

std::vector<std::string> checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : impl_->where) out.push_back(name);
  return out;
}
std::size_t checkpoint::file_count() const { return impl_->files.size(); }
bool checkpoint::contains(std::string_view name) const { return impl_->where.find(name) != impl_->where.end(); }

result<tensor_view> checkpoint::get(std::string_view name) const {
  auto it = impl_->where.find(name);
  if (it == impl_->where.end())
    return result<tensor_view>::failure(impl_->description + ": no tensor named " + printable_name(name));
  return *impl_->files[it->second].find(name);
}

result<tensor_view> checkpoint::get(std::string_view name, dtype expected_type,
                                    const std::vector<std::int64_t>& expected_shape) const {
  auto t = get(name);
  if (!t) return t;
  if (t->type() != expected_type || t->shape() != expected_shape)
    return result<tensor_view>::failure(*t->file + ": tensor " + printable_name(name) + ": expected " +
                                        std::string(dtype_name(expected_type)) + " " + shape_string(expected_shape) +
                                        ", found " + std::string(dtype_name(t->type())) + " " + shape_string(t->shape()));
  return t;
}

result<std::vector<float>> checkpoint::load_float(std::string_view name_view,
                                                  std::vector<std::int64_t>* shape_out,
                                                  std::int64_t block_rows,
                                                  std::int64_t block_cols) const {
  auto t = get(name_view);
  if (!t) return result<std::vector<float>>::failure(t.error());
  const std::string name(name_view);
  // Companion scale: "<base>.scale" for "<base>.weight" (DeepSeek-V4), else "<name>_scale_inv" (V3).
  std::optional<tensor_view> scale;
  if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0) {
    auto s = get(name.substr(0, name.size() - 7) + ".scale");
    if (s) scale = *s;
  }
  if (!scale) {
    auto s = get(name + "_scale_inv");
    if (s) scale = *s;
  }
  const dtype ty = t->type();
  if (ty == dtype::F4 || ((ty == dtype::I8 || ty == dtype::U8) && scale)) {
    if (!scale)
      return result<std::vector<float>>::failure(*t->file + ": tensor " + printable_name(name) + ": FP4 weight without a '.scale' companion");
    return dequantize_fp4(*t, *scale, 32, shape_out);
  }
  if (shape_out) *shape_out = t->shape();
  if (ty == dtype::F8_E4M3 && scale) return dequantize_fp8_blocks(*t, *scale, block_rows, block_cols);
  return to_float32(*t);
}

// --- element conversions -------------------------------------------------------------------------

float bf16_to_float(std::uint16_t bits) {
  std::uint32_t u = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1f;
  const std::uint32_t mant = h & 0x3ff;
  float mag;
  if (exp == 0) mag = std::ldexp(float(mant), -24);
  else if (exp == 31) mag = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else mag = std::ldexp(float(mant | 0x400), exp - 25);
  std::uint32_t u;
  std::memcpy(&u, &mag, 4);
  u |= sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float fp8_e4m3_to_float(std::uint8_t b) {
  if ((b & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  const float mag = portable::e4m3_grid{}(b & 0x7f);
  return (b & 0x80) != 0 ? -mag : mag;
}

float fp8_e8m0_to_float(std::uint8_t b) {
  if (b == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return portable::e8m0_value(b);
}

float fp4_e2m1_to_float(std::uint8_t nibble) {
  const float m = portable::e2m1_grid{}(nibble & 0x7);
  return (nibble & 0x8) ? -m : m;
}

namespace {

float fp8_e5m2_to_float(std::uint8_t b) { return fp16_to_float(std::uint16_t(b) << 8); }

// Element i of an unscaled tensor as float; the caller checked the dtype is supported.
float element(const tensor_view& t, std::uint64_t i) {
  const std::byte* p = t.bytes.data();
  switch (t.type()) {
    case dtype::F32: return load_le<float>(p + 4 * i);
    case dtype::F64: return float(load_le<double>(p + 8 * i));
    case dtype::F16: return fp16_to_float(load_le<std::uint16_t>(p + 2 * i));
    case dtype::BF16: return bf16_to_float(load_le<std::uint16_t>(p + 2 * i));
    case dtype::F8_E4M3: return fp8_e4m3_to_float(std::uint8_t(p[i]));
    case dtype::F8_E5M2: return fp8_e5m2_to_float(std::uint8_t(p[i]));
    case dtype::F8_E8M0: return fp8_e8m0_to_float(std::uint8_t(p[i]));
    case dtype::BOOL:
    case dtype::U8: return float(std::uint8_t(p[i]));
    case dtype::I8: return float(std::int8_t(p[i]));
    case dtype::I16: return float(load_le<std::int16_t>(p + 2 * i));
    case dtype::U16: return float(load_le<std::uint16_t>(p + 2 * i));
    case dtype::I32: return float(load_le<std::int32_t>(p + 4 * i));
    case dtype::U32: return float(load_le<std::uint32_t>(p + 4 * i));
    case dtype::I64: return float(load_le<std::int64_t>(p + 8 * i));
    case dtype::U64: return float(load_le<std::uint64_t>(p + 8 * i));
    case dtype::F4: {
      std::uint8_t byte = std::uint8_t(p[i / 2]);
      return fp4_e2m1_to_float(i % 2 ? byte >> 4 : byte & 0xf);
    }
  }
  return 0.0f;
}

bool is_scale_type(dtype t) { return t == dtype::F8_E8M0 || t == dtype::F32 || t == dtype::BF16; }

std::string where(const tensor_view& t) { return *t.file + ": tensor " + printable_name(t.name()); }

}  // namespace

result<std::vector<float>> to_float32(const tensor_view& t) {
  const std::uint64_t n = t.numel();
  if (n * dtype_bits(t.type()) / 8 != t.bytes.size())
    return result<std::vector<float>>::failure(where(t) + ": byte size does not match its shape");
  std::vector<float> out(n);
  for (std::uint64_t i = 0; i < n; ++i) out[i] = element(t, i);
  return out;
}

result<std::vector<float>> dequantize_fp8_blocks(const tensor_view& w, const tensor_view& s,
                                                 std::int64_t br, std::int64_t bc) {
  using R = result<std::vector<float>>;
  if (w.type() != dtype::F8_E4M3 || w.shape().size() != 2)
    return R::failure(where(w) + ": expected a 2-D F8_E4M3 weight, found " + std::string(dtype_name(w.type())) + " " + shape_string(w.shape()));
  if (br <= 0 || bc <= 0) return R::failure(where(w) + ": block sizes must be positive");
  const std::int64_t rows = w.shape()[0], cols = w.shape()[1];
  const std::vector<std::int64_t> want = {(rows + br - 1) / br, (cols + bc - 1) / bc};
  if (!is_scale_type(s.type()) || s.shape() != want)
    return R::failure(where(s) + ": expected the block scales of " + printable_name(w.name()) + " as F8_E8M0, F32 or BF16 " +
                      shape_string(want) + ", found " + std::string(dtype_name(s.type())) + " " + shape_string(s.shape()));
  std::vector<float> out(std::size_t(rows) * std::size_t(cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const float scale = element(s, std::uint64_t((i / br) * want[1] + j / bc));
      out[std::size_t(i * cols + j)] = fp8_e4m3_to_float(std::uint8_t(w.bytes[std::size_t(i * cols + j)])) * scale;
    }
  return out;
}

result<std::vector<float>> dequantize_fp4(const tensor_view& w, const tensor_view& s, std::int64_t block,
                                          std::vector<std::int64_t>* shape_out) {
  using R = result<std::vector<float>>;
  if (w.shape().size() != 2 || (w.type() != dtype::I8 && w.type() != dtype::U8 && w.type() != dtype::F4))
    return R::failure(where(w) + ": expected a 2-D packed FP4 weight (I8, U8 or F4), found " + std::string(dtype_name(w.type())) + " " +
                      shape_string(w.shape()));
  if (block <= 0) return R::failure(where(w) + ": block size must be positive");
  const std::int64_t rows = w.shape()[0];
  const std::int64_t cols = w.type() == dtype::F4 ? w.shape()[1] : 2 * w.shape()[1];
  if (cols % block)
    return R::failure(where(w) + ": " + std::to_string(cols) + " FP4 columns are not a multiple of the scale block " + std::to_string(block));
  const std::vector<std::int64_t> want = {rows, cols / block};
  if (!is_scale_type(s.type()) || s.shape() != want)
    return R::failure(where(s) + ": expected the FP4 scales of " + printable_name(w.name()) + " as F8_E8M0, F32 or BF16 " +
                      shape_string(want) + ", found " + std::string(dtype_name(s.type())) + " " + shape_string(s.shape()));
  std::vector<float> out(std::size_t(rows) * std::size_t(cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::size_t k = std::size_t(i * cols + j);
      const std::uint8_t byte = std::uint8_t(w.bytes[k / 2]);
      const std::uint8_t nibble = (k % 2) ? byte >> 4 : byte & 0xf;
      out[k] = fp4_e2m1_to_float(nibble) * element(s, std::uint64_t(i * want[1] + j / block));
    }
  if (shape_out) *shape_out = {rows, cols};
  return out;
}

// --- writer ------------------------------------------------------------------------------------

result<std::uint64_t> write_safetensors(const std::filesystem::path& path,
                                        const std::vector<tensor_to_write>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  using R = result<std::uint64_t>;
  try {
    std::vector<const tensor_to_write*> order;
    std::set<std::string> seen;
    for (const auto& t : tensors) {
      if (!seen.insert(t.name).second) return R::failure(path.string() + ": tensor " + printable_name(t.name) + " given twice");
      std::uint64_t numel = 1;
      for (auto d : t.shape) {
        if (d < 0) return R::failure(path.string() + ": tensor " + printable_name(t.name) + ": negative dimension");
        numel *= std::uint64_t(d);
      }
      if (numel * dtype_bits(t.type) / 8 != t.data.size() || (numel * dtype_bits(t.type)) % 8)
        return R::failure(path.string() + ": tensor " + printable_name(t.name) + ": " + std::to_string(t.data.size()) +
                          " bytes do not match " + std::string(dtype_name(t.type)) + " " + shape_string(t.shape));
      order.push_back(&t);
    }
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
      const auto ba = dtype_bits(a->type), bb = dtype_bits(b->type);
      return ba != bb ? ba > bb : a->name < b->name;
    });
    json h = json::object();
    if (!metadata.empty()) h["__metadata__"] = metadata;
    std::uint64_t at = 0;
    for (const auto* t : order) {
      h[t->name] = {{"dtype", dtype_name(t->type)}, {"shape", t->shape}, {"data_offsets", {at, at + t->data.size()}}};
      at += t->data.size();
    }
    std::string text = h.dump();
    while ((8 + text.size()) % 8) text += ' ';
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return R::failure(path.string() + ": cannot write the file");
    const std::uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const auto* t : order) out.write(reinterpret_cast<const char*>(t->data.data()), std::streamsize(t->data.size()));
    if (!out) return R::failure(path.string() + ": write failed");
    return 8 + n + at;
  } catch (const std::exception& e) {
    return R::failure(path.string() + ": " + e.what());
  }
}

}  // namespace troupe::kernels

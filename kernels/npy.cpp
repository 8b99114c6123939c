#include "kernels/npy.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

namespace troupe::kernels {

namespace {

constexpr char magic[] = "\x93NUMPY";

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace

std::vector<char> npy_header(std::span<const std::int64_t> shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  const std::size_t fixed = 6 + 2 + 2;  // magic, version, u16 length
  std::size_t len = dict.size() + 1;    // + '\n'
  len += (64 - (fixed + len) % 64) % 64;
  dict.append(len - 1 - dict.size(), ' ');
  dict += '\n';
  std::vector<char> out(magic, magic + 6);
  out.push_back(1);
  out.push_back(0);
  out.push_back(char(len & 0xff));
  out.push_back(char(len >> 8));
  out.insert(out.end(), dict.begin(), dict.end());
  return out;
}

result<std::uint64_t> write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape,
                                std::span<const float> data) {
  using R = result<std::uint64_t>;
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d < 0) return R::failure(path.string() + ": negative dimension " + std::to_string(d));
    n *= std::uint64_t(d);
  }
  if (n != data.size())
    return R::failure(path.string() + ": shape " + shape_text(shape) + " holds " + std::to_string(n) +
                      " values, given " + std::to_string(data.size()));
  static_assert(sizeof(float) == 4);
  const auto header = npy_header(shape);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return R::failure(path.string() + ": cannot open for writing");
  out.write(header.data(), std::streamsize(header.size()));
  for (float v : data) {  // little-endian on every platform
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    const char b[4] = {char(u & 0xff), char((u >> 8) & 0xff), char((u >> 16) & 0xff), char(u >> 24)};
    out.write(b, 4);
  }
  out.close();
  if (!out) return R::failure(path.string() + ": write failed");
  return std::uint64_t(header.size() + 4 * data.size());
}

result<npy_array> read_npy(const std::filesystem::path& path) {
  using R = result<npy_array>;
  std::ifstream in(path, std::ios::binary);
  if (!in) return R::failure(path.string() + ": cannot open");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string file = path.string();
  if (bytes.size() < 10 || bytes.compare(0, 6, magic, 6) != 0) return R::failure(file + ": not a .npy file (magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t len = 0, start = 0;
  if (major == 1) {
    len = static_cast<unsigned char>(bytes[8]) | std::size_t(static_cast<unsigned char>(bytes[9])) << 8;
    start = 10;
  } else if (major == 2 && bytes.size() >= 12) {
    for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(bytes[8 + std::size_t(i)]);
    start = 12;
  } else {
    return R::failure(file + ": unsupported .npy version " + std::to_string(major));
  }
  if (start + len > bytes.size()) return R::failure(file + ": header runs past the end");
  const std::string header = bytes.substr(start, len);
  static const std::regex descr(R"('descr':\s*'([^']*)')"), order(R"('fortran_order':\s*(True|False))"),
      shape_re(R"('shape':\s*\(([^)]*)\))");
  std::smatch m;
  if (!std::regex_search(header, m, descr) || m[1] != "<f4")
    return R::failure(file + ": descr: expected '<f4', found " + (m.empty() ? std::string("none") : "'" + m[1].str() + "'"));
  if (!std::regex_search(header, m, order) || m[1] != "False")
    return R::failure(file + ": fortran_order: expected False");
  if (!std::regex_search(header, m, shape_re)) return R::failure(file + ": no shape in the header");
  npy_array a;
  std::uint64_t n = 1;
  const std::string dims = m[1];
  static const std::regex num(R"(\d+)");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    a.shape.push_back(std::stoll(it->str()));
    n *= std::uint64_t(a.shape.back());
  }
  const std::size_t data_start = start + len;
  if (bytes.size() - data_start != 4 * n)
    return R::failure(file + ": shape " + shape_text(a.shape) + " needs " + std::to_string(4 * n) +
                      " data bytes, found " + std::to_string(bytes.size() - data_start));
  a.data.resize(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes.data() + data_start + 4 * i);
    const std::uint32_t u = b[0] | std::uint32_t(b[1]) << 8 | std::uint32_t(b[2]) << 16 | std::uint32_t(b[3]) << 24;
    std::memcpy(&a.data[i], &u, 4);
  }
  return a;
}

}  // namespace troupe::kernels

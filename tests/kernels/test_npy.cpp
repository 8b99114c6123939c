// The .npy writer: the exact v1.0 header numpy expects, round trips through the reader for
// 0-d to 3-d arrays, and refusals (wrong element count, other dtypes, truncated files).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "kernels/npy.hpp"
#include "scratch.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path dir = testing::scratch_root() / "npy";
  fs::create_directories(dir);
  return dir / name;
}

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

}  // namespace

TEST_CASE("npy: the v1.0 header is numpy's, padded to a multiple of 64 bytes") {
  const std::vector<std::int64_t> shape = {2, 3};
  const auto h = npy_header(shape);
  const std::string s(h.begin(), h.end());
  CHECK(s.size() == 128);  // what numpy.save writes for this shape
  CHECK(s.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  CHECK(static_cast<unsigned char>(s[8]) == 118);
  CHECK(s[9] == 0);
  CHECK(s.substr(10, 118).rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0) == 0);
  CHECK(s.back() == '\n');
  const std::vector<std::int64_t> one = {5};
  const auto h1 = npy_header(one);
  CHECK(std::string(h1.begin(), h1.end()).find("'shape': (5,), }") != std::string::npos);
  CHECK(npy_header(std::vector<std::int64_t>{}).size() % 64 == 0);
}

TEST_CASE("npy: write then read gives the same shape and bits") {
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{}, {7}, {3, 4}, {2, 3, 5}, {0, 4}, {1, 129280}}) {
    CAPTURE(shape.size());
    std::size_t n = 1;
    for (auto d : shape) n *= std::size_t(d);
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = float(std::sin(double(i)) * 1e3);
    if (n > 2) {
      v[0] = -0.0f;
      v[1] = INFINITY;
    }
    const auto p = scratch("a.npy");
    auto w = write_npy(p, shape, v);
    REQUIRE_MESSAGE(w.ok(), w.error());
    CHECK(*w == fs::file_size(p));
    CHECK(fs::file_size(p) == 128 + 4 * n);
    auto r = read_npy(p);
    REQUIRE_MESSAGE(r.ok(), r.error());
    CHECK(r->shape == shape);
    REQUIRE(r->data.size() == n);
    CHECK(std::memcmp(r->data.data(), v.data(), 4 * n) == 0);
  }
}

TEST_CASE("npy: refused inputs and files") {
  const auto p = scratch("b.npy");
  const std::vector<float> v = {1, 2, 3};
  CHECK(write_npy(p, std::vector<std::int64_t>{2, 2}, v).error().find("holds 4 values, given 3") != std::string::npos);
  CHECK(!write_npy(p, std::vector<std::int64_t>{-3}, v).ok());
  CHECK(!write_npy(fs::path("/nonexistent-dir/x.npy"), std::vector<std::int64_t>{3}, v).ok());
  REQUIRE(write_npy(p, std::vector<std::int64_t>{3}, v).ok());
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  write_bytes(p, bytes.substr(0, bytes.size() - 1));
  CHECK(read_npy(p).error().find("needs 12 data bytes, found 11") != std::string::npos);
  std::string f8 = bytes;
  f8.replace(f8.find("<f4"), 3, "<f8");
  write_bytes(p, f8);
  CHECK(read_npy(p).error().find("descr") != std::string::npos);
  std::string fortran = bytes;
  fortran.replace(fortran.find("False"), 5, "True ");
  write_bytes(p, fortran);
  CHECK(read_npy(p).error().find("fortran_order") != std::string::npos);
  write_bytes(p, "not numpy at all");
  CHECK(read_npy(p).error().find("magic") != std::string::npos);
  CHECK(!read_npy(scratch("missing.npy")).ok());
}

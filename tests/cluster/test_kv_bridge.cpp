// Tests of cluster/launch/kv_bridge: a KV snapshot as one byte string for the fabric link.
#include "cluster/launch/kv_bridge.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace troupe;
using namespace troupe::cluster;

namespace {

runtime::kv_snapshot sample() {
  runtime::kv_snapshot s;
  s.model = "small-1";
  s.length = 300;
  for (int i = 0; i < 2; ++i)
    s.blocks.push_back(runtime::kv_bytes{std::string(1000 + i, static_cast<char>('a' + i)),
                                         0x1111u * static_cast<unsigned>(i + 1)});
  s.state = runtime::kv_bytes{std::string("state\0bytes", 11), 42};
  s.swa = runtime::kv_bytes{std::string(777, '\xff'), 7};
  return s;
}

bool same(const runtime::kv_snapshot& a, const runtime::kv_snapshot& b) {
  if (a.model != b.model || a.length != b.length || a.blocks.size() != b.blocks.size()
      || a.state.bytes != b.state.bytes || a.state.checksum != b.state.checksum
      || a.swa.bytes != b.swa.bytes || a.swa.checksum != b.swa.checksum)
    return false;
  for (std::size_t i = 0; i < a.blocks.size(); ++i)
    if (a.blocks[i].bytes != b.blocks[i].bytes || a.blocks[i].checksum != b.blocks[i].checksum)
      return false;
  return true;
}

} // namespace

TEST_CASE("a snapshot survives encoding byte for byte") {
  auto s = sample();
  auto back = decode_snapshot(encode_snapshot(s));
  REQUIRE(back.has_value());
  CHECK(same(s, *back));
  runtime::kv_snapshot empty;
  auto e = decode_snapshot(encode_snapshot(empty));
  REQUIRE(e.has_value());
  CHECK(same(empty, *e));
}

TEST_CASE("a truncated, extended or foreign byte string is not a snapshot") {
  auto bytes = encode_snapshot(sample());
  for (std::size_t cut : {std::size_t{0}, std::size_t{3}, std::size_t{20}, bytes.size() / 2,
                          bytes.size() - 1})
    CHECK_FALSE(decode_snapshot(std::string_view(bytes).substr(0, cut)).has_value());
  CHECK_FALSE(decode_snapshot(bytes + "x").has_value());
  auto foreign = bytes;
  foreign[0] ^= 1;
  CHECK_FALSE(decode_snapshot(foreign).has_value());
}

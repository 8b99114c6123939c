// Round trips of the wire schemas through Cap'n Proto bytes, and refusal of bad bytes.
#include "schemas/convert.hpp"
#include "schemas/kv_block.capnp.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <numeric>

using namespace troupe::schemas;

namespace {

constexpr auto u64_max = std::numeric_limits<std::uint64_t>::max();

request_envelope full_request() {
  request_envelope r;
  r.request_id = u64_max;
  r.api = api_protocol::messages;
  r.traffic = traffic_class::agent;
  r.model = "deepseek-v4.1-flash";
  r.prompt_tokens.resize(100'000);
  std::iota(r.prompt_tokens.begin(), r.prompt_tokens.end(), 4'000'000'000u);
  r.images = {{"img-0", 1, 0}, {"img-1", u64_max, 0x0123456789abcdefULL}};
  r.sampling.max_tokens = std::numeric_limits<std::uint32_t>::max();
  r.sampling.temperature = 0.0f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = u64_max;
  r.sampling.n = 3;
  r.sampling.stop_token_ids = {0, 1, std::numeric_limits<std::uint32_t>::max()};
  r.deadline_ns = u64_max;
  r.arrival_ns = 1'795'000'000'000'000'000ULL;
  r.priority = std::numeric_limits<std::int32_t>::min();
  r.stream = true;
  return r;
}

kv_block_descriptor block(std::uint64_t hash, std::uint64_t parent, std::uint16_t tokens = 128) {
  kv_block_descriptor b;
  b.hash = hash;
  b.parent_hash = parent;
  b.token_count = tokens;
  b.byte_size = 113'920;
  b.checksum = u64_max;
  b.traffic = traffic_class::batch;
  b.expiry_ns = u64_max;
  b.model_tag = 0xdeadbeefcafef00dULL;
  return b;
}

template <class T>
T round_trip(const T& x) {
  auto bytes = encode(x);
  CHECK(bytes.size() % 8 == 0);
  auto out = decode<T>(bytes);
  REQUIRE_MESSAGE(out.has_value(), out.error().message);
  return std::move(out).value();
}

// A KvBlock message written with the generated code directly, bypassing encode().
std::vector<std::byte> raw_block(std::uint16_t token_count) {
  capnp::MallocMessageBuilder builder;
  auto b = builder.initRoot<troupe::schemas::wire::KvBlock>();
  b.setHash(7);
  b.setTokenCount(token_count);
  auto words = capnp::messageToFlatArray(builder);
  std::vector<std::byte> out(words.asBytes().size());
  std::memcpy(out.data(), words.asBytes().begin(), out.size());
  return out;
}

} // namespace

TEST_CASE("a request with every field set survives a round trip") {
  auto r = full_request();
  CHECK(round_trip(r) == r);
}

TEST_CASE("a request with empty lists and no seed survives a round trip") {
  request_envelope r;
  r.model = "m";
  r.sampling.stop_token_ids.clear();
  auto out = round_trip(r);
  CHECK(out == r);
  CHECK(out.prompt_tokens.empty());
  CHECK(out.images.empty());
  CHECK_FALSE(out.sampling.seed.has_value());
}

TEST_CASE("a seed of 0 is kept apart from no seed") {
  request_envelope r;
  r.model = "m";
  r.sampling.seed = 0;
  auto out = round_trip(r);
  REQUIRE(out.sampling.seed.has_value());
  CHECK(*out.sampling.seed == 0);
}

TEST_CASE("a kv block descriptor with edge values survives a round trip") {
  auto b = block(u64_max, u64_max - 1);
  CHECK(round_trip(b) == b);
  auto first = block(1, 0, 1);
  CHECK(round_trip(first) == first);
}

TEST_CASE("a kv block chain survives a round trip, empty or long") {
  kv_block_chain empty;
  CHECK(round_trip(empty) == empty);
  kv_block_chain chain;
  std::uint64_t parent = 0;
  for (std::uint64_t h = 1; h <= 1000; ++h) {
    chain.blocks.push_back(block(h * 0x9e3779b97f4a7c15ULL, parent, h == 1000 ? 5 : 128));
    parent = chain.blocks.back().hash;
  }
  CHECK(round_trip(chain) == chain);
}

TEST_CASE("decoding empty, truncated or odd-sized bytes returns truncated") {
  auto bytes = encode(full_request());
  CHECK(decode<request_envelope>({}).error().code == schema_errc::truncated);
  auto odd = std::span<const std::byte>(bytes).first(bytes.size() - 3);
  CHECK(decode<request_envelope>(odd).error().code == schema_errc::truncated);
  for (std::size_t words : {1u, 2u, 8u, 100u}) {
    auto cut = std::span<const std::byte>(bytes).first(words * 8);
    auto out = decode<request_envelope>(cut);
    REQUIRE_FALSE(out.has_value());
    CHECK(out.error().code == schema_errc::truncated);
  }
}

TEST_CASE("decoding garbage bytes returns an error, not a crash") {
  std::vector<std::byte> garbage(64);
  for (std::size_t i = 0; i < garbage.size(); ++i)
    garbage[i] = static_cast<std::byte>(0xa5 ^ (i * 37));
  CHECK_FALSE(decode<request_envelope>(garbage).has_value());
  CHECK_FALSE(decode<kv_block_descriptor>(garbage).has_value());
  CHECK_FALSE(decode<kv_block_chain>(garbage).has_value());
  std::vector<std::byte> ones(64, std::byte{0xff});
  CHECK_FALSE(decode<request_envelope>(ones).has_value());
}

TEST_CASE("every corruption of one byte of a message decodes or fails, never crashes") {
  auto bytes = encode(full_request());
  bytes.resize(256);  // keep the test fast: the header, the root and the start of the lists
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto copy = bytes;
    copy[i] ^= std::byte{0xff};
    auto out = decode<request_envelope>(copy);  // truncated: must fail
    CHECK_FALSE(out.has_value());
  }
  auto block_bytes = encode(block(5, 4));
  for (std::size_t i = 0; i < block_bytes.size(); ++i) {
    auto copy = block_bytes;
    copy[i] ^= std::byte{0x5a};
    (void) decode<kv_block_descriptor>(copy);  // any outcome but a crash or an exception
  }
}

TEST_CASE("trailing bytes after a message are refused") {
  auto bytes = encode(block(5, 4));
  bytes.resize(bytes.size() + 8);
  CHECK(decode<kv_block_descriptor>(bytes).error().code == schema_errc::malformed);
}

TEST_CASE("a kv block with 129 tokens is rejected") {
  CHECK(decode<kv_block_descriptor>(raw_block(128)).has_value());
  auto out = decode<kv_block_descriptor>(raw_block(129));
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code == schema_errc::invalid);
  CHECK(decode<kv_block_descriptor>(raw_block(0)).error().code == schema_errc::invalid);
}

TEST_CASE("a kv block with hash 0 or that is its own parent is rejected") {
  CHECK(validate(block(0, 0)).has_value());
  CHECK(validate(block(9, 9)).has_value());
  CHECK(decode<kv_block_descriptor>(encode(block(9, 9))).error().code == schema_errc::invalid);
  CHECK_FALSE(validate(block(9, 0)).has_value());
}

TEST_CASE("a chain whose blocks do not link, mix models or has a partial middle is rejected") {
  kv_block_chain broken{{block(1, 0), block(2, 99)}};
  CHECK(decode<kv_block_chain>(encode(broken)).error().code == schema_errc::invalid);
  kv_block_chain mixed{{block(1, 0), block(2, 1)}};
  mixed.blocks[1].model_tag += 1;
  CHECK(validate(mixed).has_value());
  kv_block_chain partial{{block(1, 0, 64), block(2, 1)}};
  CHECK(validate(partial).has_value());
  kv_block_chain ok{{block(1, 0), block(2, 1, 64)}};
  CHECK_FALSE(validate(ok).has_value());
}

TEST_CASE("a request breaking its invariants is rejected on decode") {
  auto r = full_request();
  r.model.clear();
  CHECK(decode<request_envelope>(encode(r)).error().code == schema_errc::invalid);
  r = full_request();
  r.sampling.n = 0;
  CHECK(decode<request_envelope>(encode(r)).error().code == schema_errc::invalid);
  r = full_request();
  r.sampling.top_p = 0.0f;
  CHECK(validate(r).has_value());
  r = full_request();
  r.sampling.temperature = std::numeric_limits<float>::quiet_NaN();
  CHECK(validate(r).has_value());
  r = full_request();
  r.deadline_ns = r.arrival_ns - 1;
  CHECK(validate(r).has_value());
}

TEST_CASE("an enumerant this build does not know is rejected") {
  auto b = block(5, 4);
  b.traffic = static_cast<traffic_class>(7);
  CHECK(decode<kv_block_descriptor>(encode(b)).error().code == schema_errc::invalid);
}

TEST_CASE("payload_checksum is xxhash64 with seed 0") {
  // XXH64 of the empty input with seed 0.
  CHECK(payload_checksum({}) == 0xef46db3751d8e999ULL);
}

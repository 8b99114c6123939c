// Tests of runtime/units: sizes and durations as people write them.
#include "runtime/units.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>

using namespace std::chrono_literals;
using troupe::runtime::format_bytes;
using troupe::runtime::format_duration;
using troupe::runtime::parse_duration;
using troupe::runtime::parse_size;

namespace {

std::uint64_t size_of(const char* text) {
  auto r = parse_size(text);
  INFO("input: ", text, " error: ", r.error);
  REQUIRE(r.ok());
  return r.value;
}

std::string size_error(const char* text) {
  auto r = parse_size(text);
  INFO("input: ", text);
  REQUIRE_FALSE(r.ok());
  return r.error;
}

caf::timespan duration_of(const char* text) {
  auto r = parse_duration(text);
  INFO("input: ", text, " error: ", r.error);
  REQUIRE(r.ok());
  return r.value;
}

std::string duration_error(const char* text) {
  auto r = parse_duration(text);
  INFO("input: ", text);
  REQUIRE_FALSE(r.ok());
  return r.error;
}

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t GiB = KiB * KiB * KiB;
constexpr std::uint64_t PiB = GiB * KiB * KiB;

} // namespace

TEST_CASE("a bare number is a count of bytes") {
  CHECK(size_of("4096") == 4096);
  CHECK(size_of("0") == 0);
  CHECK(size_of(" 17 ") == 17);
}

TEST_CASE("binary units are powers of 1024") {
  CHECK(size_of("512GiB") == 512 * GiB);
  CHECK(size_of("100PiB") == 100 * PiB);
  CHECK(size_of("1Ki") == 1024);
  CHECK(size_of("2 MiB") == 2 * KiB * KiB);
}

TEST_CASE("decimal units are powers of 1000") {
  CHECK(size_of("1.5TB") == 1'500'000'000'000ULL);
  CHECK(size_of("3K") == 3000);
  CHECK(size_of("2PB") == 2'000'000'000'000'000ULL);
}

TEST_CASE("size units are case-insensitive") {
  CHECK(size_of("512gib") == 512 * GiB);
  CHECK(size_of("512GIB") == 512 * GiB);
  CHECK(size_of("1kb") == 1000);
}

TEST_CASE("a fractional size rounds to the nearest byte") {
  CHECK(size_of("1.5KiB") == 1536);
  CHECK(size_of("0.3KiB") == 307);
}

TEST_CASE("the largest size is 2^64 - 1 bytes and anything above is an overflow error") {
  CHECK(size_of("18446744073709551615") == UINT64_MAX);
  CHECK(size_of("15.99EiB") > 15 * KiB * PiB);
  CHECK(size_error("16EiB").find("too large") != std::string::npos);
  CHECK(size_error("18446744073709551616").find("too large") != std::string::npos);
  CHECK(size_error("99999999999999999999999PB").find("too large") != std::string::npos);
}

TEST_CASE("malformed sizes are errors that say what is wrong") {
  CHECK(size_error("").find("empty size") != std::string::npos);
  CHECK(size_error("-5GiB").find("negative") != std::string::npos);
  CHECK(size_error("GiB").find("not a size") != std::string::npos);
  CHECK(size_error("5XB").find("unknown size unit 'XB'") != std::string::npos);
  CHECK(size_error("5 GiBs").find("unknown size unit") != std::string::npos);
  CHECK(size_error("4096.5").find("fractional number of bytes") != std::string::npos);
}

TEST_CASE("a duration is numbers with units") {
  CHECK(duration_of("7d") == 7 * 24h);
  CHECK(duration_of("60s") == 60s);
  CHECK(duration_of("250ms") == 250ms);
  CHECK(duration_of("3min") == 3min);
  CHECK(duration_of("3m") == 3min);
  CHECK(duration_of("12us") == 12us);
  CHECK(duration_of("5ns") == 5ns);
}

TEST_CASE("a duration may combine units from the largest down") {
  CHECK(duration_of("1h30m") == 90min);
  CHECK(duration_of("1d12h") == 36h);
  CHECK(duration_of("2m30s500ms") == 150500ms);
}

TEST_CASE("a duration may have a fraction") {
  CHECK(duration_of("2.5s") == 2500ms);
  CHECK(duration_of("0.5h") == 30min);
  CHECK(duration_of("1.5ns") == 2ns); // rounded to the nearest nanosecond
}

TEST_CASE("malformed durations are errors that say what is wrong") {
  CHECK(duration_error("").find("empty duration") != std::string::npos);
  CHECK(duration_error("60").find("without a unit") != std::string::npos);
  CHECK(duration_error("-1s").find("negative") != std::string::npos);
  CHECK(duration_error("3x").find("unknown duration unit 'x'") != std::string::npos);
  CHECK(duration_error("1H").find("did you mean 'h'") != std::string::npos);
  CHECK(duration_error("30m1h").find("out of order") != std::string::npos);
  CHECK(duration_error("1m1m").find("out of order") != std::string::npos);
  CHECK(duration_error("s").find("not a duration") != std::string::npos);
}

TEST_CASE("a duration longer than caf::timespan can hold is an overflow error") {
  CHECK(duration_error("300000d").find("too large") != std::string::npos);
  CHECK(duration_of("106751d") > 106750 * 24h);
}

TEST_CASE("format_bytes uses the largest binary unit that keeps the number at least one") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(17) == "17 B");
  CHECK(format_bytes(4096) == "4 KiB");
  CHECK(format_bytes(3 * GiB / 2) == "1.5 GiB");
  CHECK(format_bytes(100 * PiB) == "100 PiB");
  CHECK(format_bytes(GiB - 1) == "1 GiB");
  CHECK(format_bytes(UINT64_MAX) == "16 EiB");
}

TEST_CASE("format_bytes output reads back with parse_size") {
  CHECK(size_of(format_bytes(100 * PiB).c_str()) == 100 * PiB);
  CHECK(size_of(format_bytes(512 * GiB).c_str()) == 512 * GiB);
}

TEST_CASE("format_duration prints compact units that parse_duration reads back") {
  CHECK(format_duration(0s) == "0s");
  CHECK(format_duration(800ns) == "800ns");
  CHECK(format_duration(1500ns) == "1.5us");
  CHECK(format_duration(250ms) == "250ms");
  CHECK(format_duration(2500ms) == "2.5s");
  CHECK(format_duration(90min) == "1h30m");
  CHECK(format_duration(72h) == "3d");
  CHECK(format_duration(60250ms) == "1m0.25s");
  for (auto d : {caf::timespan{1ns}, caf::timespan{1234567ns}, caf::timespan{36h + 5s + 1ns},
                 caf::timespan{7 * 24h}}) {
    CHECK(duration_of(format_duration(d).c_str()) == d);
  }
}

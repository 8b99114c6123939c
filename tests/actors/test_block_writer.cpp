// The KV block writer: decode persists every 128-token block its KV fills, chained onto the
// prompt's blocks, so a later match of the extended chain hits them.
#include "serving_fixture.hpp"

#include "actors/kv/block_writer.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::testing;

TEST_CASE("decode persists each block it fills, visible to a match of the extended chain") {
  cluster_shape shape;
  shape.block_writer = true;
  serving_cluster s{shape};
  // A 1000-token prompt (7 full blocks) and 300 output tokens: prefill gives the first, decode
  // the other 299, so the KV grows to 1299 tokens and fills the blocks ending at 1024, 1152
  // and 1280 (sequence blocks 7, 8 and 9).
  s.submit(1, 1000, 300);
  s.run();
  REQUIRE(s.outcomes->at(1).completed);
  CHECK(*s.persisted == 3);
  auto prompt = serving_cluster::chain_of(1000, 1000);
  REQUIRE(prompt.size() == 7);
  // The extended chain, one block further than decode filled: 10 hits, then the miss.
  auto chain = prompt;
  auto decoded = decode_chain(prompt.back(), 7, 1, 7, 4);
  chain.insert(chain.end(), decoded.begin(), decoded.end());
  auto m = ask<kv_match_result>(s.sys, s.kv, kv_match{chain, traffic_class::chatbot, 0});
  s.run();
  REQUIRE(*m);
  CHECK((*m)->hit_blocks == 10);
}

TEST_CASE("decode persists no block when the KV never reaches a block boundary") {
  cluster_shape shape;
  shape.block_writer = true;
  serving_cluster s{shape};
  s.submit(1, 1000, 24); // the KV ends at 1023 tokens
  s.run();
  REQUIRE(s.outcomes->at(1).completed);
  CHECK(*s.persisted == 0);
}

TEST_CASE("without a block writer the blocks decode fills are not persisted") {
  serving_cluster s;
  s.submit(1, 1000, 300);
  s.run();
  REQUIRE(s.outcomes->at(1).completed);
  auto prompt = serving_cluster::chain_of(1000, 1000);
  auto chain = prompt;
  auto decoded = decode_chain(prompt.back(), 7, 1, 7, 2);
  chain.insert(chain.end(), decoded.begin(), decoded.end());
  auto m = ask<kv_match_result>(s.sys, s.kv, kv_match{chain, traffic_class::chatbot, 0});
  s.run();
  REQUIRE(*m);
  CHECK((*m)->hit_blocks == 7);
}

TEST_CASE("a decode chain continued from its tip equals the chain computed in one go") {
  block_key parent{1, 2};
  auto whole = decode_chain(parent, 3, 42, 3, 3);
  REQUIRE(whole.size() == 3);
  auto first = decode_chain(parent, 3, 42, 3, 1);
  auto rest = decode_chain(first.back(), 4, 42, 4, 2);
  CHECK(first.at(0) == whole.at(0));
  CHECK(rest.at(0) == whole.at(1));
  CHECK(rest.at(1) == whole.at(2));
  // Skipping to a later block chains through the blocks in between.
  CHECK(decode_chain(parent, 3, 42, 5, 1).at(0) == whole.at(2));
  // Another request's blocks get other keys on the same parent.
  CHECK(decode_chain(parent, 3, 43, 3, 1).at(0) != whole.at(0));
}

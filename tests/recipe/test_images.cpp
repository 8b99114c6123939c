// DeepSeek-V4.1 image token counts against deepseek_recipe 0.2.0 (tools/image_golden.py).
#include "recipe/images.hpp"
#include "recipe_fixture.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <utility>
#include <vector>

using namespace troupe::recipe;

TEST_CASE("images: V4.1 token counts equal deepseek_recipe's for every golden size") {
  const image_token_spec spec;
  std::size_t checked = 0, same = 0;
  for (const auto& rec : testing::json_records(testing::golden_path("image_tokens.v41.jsonl.gz"))) {
    const std::size_t w = rec[0], h = rec[1];
    CAPTURE(w);
    CAPTURE(h);
    const auto g = spec.fit(w, h);
    if (rec[2].is_null()) {
      CHECK(!g.has_value());
    } else {
      REQUIRE(g.has_value());
      CHECK(g->tokens == rec[2].get<std::size_t>());
      same += g->tokens == rec[2].get<std::size_t>();
    }
    ++checked;
  }
  CHECK(checked >= 5000);
  MESSAGE(same << " / " << checked << " image sizes identical");
}

TEST_CASE("images: the fitted grid's invariants") {
  const image_token_spec spec;
  for (const auto& [w, h] : std::vector<std::pair<std::size_t, std::size_t>>{
           {1, 1}, {640, 480}, {1920, 1080}, {4096, 4096}, {1, 50000}, {50000, 1}, {17, 9000}}) {
    CAPTURE(w);
    CAPTURE(h);
    const auto g = spec.fit(w, h);
    REQUIRE(g.has_value());
    CHECK(g->tokens <= spec.max_tokens);
    CHECK(g->tokens == g->rows * (g->columns + 1) + 2);
    CHECK(g->width % spec.patch == 0);
    CHECK(g->height % spec.patch == 0);
    // The fitted size is a fixed point: fitting it again changes nothing.
    const auto again = spec.fit(g->width, g->height);
    REQUIRE(again.has_value());
    CHECK(again->tokens == g->tokens);
    CHECK(again->width == g->width);
  }
  CHECK(spec.fit(1, 1)->tokens == 184);   // scaled up to 544 x 544: a 13 x 13 grid
  CHECK(spec.fit(640, 480)->tokens == 206);  // no resize: 16 x 12 after alignment
  const std::vector<std::pair<std::size_t, std::size_t>> two{{640, 480}, {1, 1}};
  CHECK(image_token_adjustment(two) == std::optional<std::size_t>(205 + 183));
}

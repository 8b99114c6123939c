// DeepSeek-V4.1 image token accounting (see images.hpp, docs/recipe.md).
#include "recipe/images.hpp"

#include <cmath>

namespace troupe::recipe {
namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// The token grid of an aligned size.
image_grid grid_of(const image_token_spec& s, std::size_t width, std::size_t height) {
  image_grid g;
  g.width = width;
  g.height = height;
  g.rows = ceil_div(height / s.patch, s.downsample);
  g.columns = ceil_div(width / s.patch, s.downsample);
  g.tokens = g.rows * (g.columns + 1) + 2;
  return g;
}

// The largest aspect-preserving grid within the token budget: with r = h / w and a grid of
// c columns and r*c rows, r*c*(c + 1) + 2 = max_tokens gives c; degenerate aspect ratios get a
// single column or row.
image_grid shrink_to_budget(const image_token_spec& s, std::size_t width, std::size_t height) {
  const std::size_t cell = s.patch * s.downsample;  // pixels per token side
  const std::size_t budget = s.max_tokens - 2;
  const double aspect = static_cast<double>(height) / static_cast<double>(width);
  const double columns = std::sqrt(static_cast<double>(budget) / aspect + 0.25) - 0.5;
  const double rows = columns * aspect;
  if (columns < 1.0) return grid_of(s, cell, budget / 2 * cell);       // one column
  if (rows < 1.0) return grid_of(s, (budget - 1) * cell, cell);         // one row
  const double scale = std::min(static_cast<double>(static_cast<std::size_t>(columns) * cell) / static_cast<double>(width),
                                static_cast<double>(static_cast<std::size_t>(rows) * cell) / static_cast<double>(height));
  const auto patches = [&](std::size_t side) {
    return static_cast<std::size_t>(static_cast<double>(side) * scale / static_cast<double>(s.patch)) * s.patch;
  };
  return grid_of(s, patches(width), patches(height));
}

// One round: scale up to the minimum area, align to patches, fit the budget.
image_grid fit_once(const image_token_spec& s, std::size_t width, std::size_t height) {
  const std::size_t area = width * height;
  if (area > 0 && area < s.min_pixels) {
    const double up = std::sqrt(static_cast<double>(s.min_pixels) / static_cast<double>(area));
    width = static_cast<std::size_t>(static_cast<double>(width) * up);
    height = static_cast<std::size_t>(static_cast<double>(height) * up);
  }
  const image_grid aligned = grid_of(s, ceil_div(width, s.patch) * s.patch, ceil_div(height, s.patch) * s.patch);
  return aligned.tokens <= s.max_tokens ? aligned : shrink_to_budget(s, width, height);
}

bool same(const image_grid& a, const image_grid& b) {
  return a.width == b.width && a.height == b.height && a.rows == b.rows && a.columns == b.columns && a.tokens == b.tokens;
}

}  // namespace

std::optional<image_grid> image_token_spec::fit(std::size_t width, std::size_t height) const {
  // Rounds repeat on the fitted size until it no longer changes (at most 10).
  image_grid g = fit_once(*this, width, height);
  for (int round = 1; round < 10; ++round) {
    const image_grid next = fit_once(*this, g.width, g.height);
    if (same(next, g)) return g;
    g = next;
  }
  return std::nullopt;
}

std::optional<std::size_t> image_token_adjustment(std::span<const std::pair<std::size_t, std::size_t>> sizes,
                                                  const image_token_spec& spec) {
  std::size_t extra = 0;
  for (const auto& [w, h] : sizes) {
    const auto g = spec.fit(w, h);
    if (!g) return std::nullopt;
    extra += g->tokens - 1;
  }
  return extra;
}

}  // namespace troupe::recipe

#pragma once
// DeepSeek-V4.1 image token accounting. A V4.1 prompt holds one `<｜image｜>` placeholder per
// image; the backend replaces it with the image's tokens, whose count follows from the image size
// after V4.1's preprocessing: an image below the minimum area is scaled up, the size is aligned to
// 14-pixel patches, the patch grid is downsampled by 3 into the model's token grid, and an image
// over the token budget is scaled down to fit it. Checked against deepseek_recipe 0.2.0's
// `MultiModalData.image_token_adjustment` (tests/recipe/golden/image_tokens.v41.jsonl.gz).

#include <cstddef>
#include <optional>
#include <span>
#include <utility>

namespace troupe::recipe {

struct image_grid {
  std::size_t width = 0, height = 0;  // the preprocessed size in pixels (multiples of 14)
  std::size_t rows = 0, columns = 0;  // the model token grid
  std::size_t tokens = 0;             // rows * (columns + 1) + 2: a newline per row, start and end
};

struct image_token_spec {
  std::size_t patch = 14;           // pixels per patch side
  std::size_t downsample = 3;       // patches per token side
  std::size_t max_tokens = 1024;    // per image
  std::size_t min_pixels = 544 * 544;

  // The preprocessed size and token grid of a width x height image; nullopt when the fitting does
  // not settle within 10 rounds (the reference's CalcResizeError).
  std::optional<image_grid> fit(std::size_t width, std::size_t height) const;
};

// Tokens the images add beyond their one placeholder each (the reference's
// image_token_adjustment); nullopt when one of them cannot be fitted.
std::optional<std::size_t> image_token_adjustment(std::span<const std::pair<std::size_t, std::size_t>> sizes,
                                                  const image_token_spec& spec = {});

}  // namespace troupe::recipe

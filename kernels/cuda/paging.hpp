// The paged compressed KV of the device forward pass (kernels/cuda/device_model.cpp): a pool of
// pages that every sequence takes from as it grows. Page j of a sequence holds its context's
// tokens [j · page_tokens, (j + 1) · page_tokens); in the store of a KV source of ratio r a page
// is page_tokens / r consecutive rows, so group g of the sequence lies in its page g / rows, at
// row g mod rows of it. One definition for the host (which places the compressor's rows and
// copies blocks in and out) and the kernel that turns the indexer's selection into store rows.
#pragma once

#include <cstdint>

#include "kernels/portable_math.hpp"

namespace troupe::kernels::cuda {

/// The store row of a sequence's group g: `pages` its page ids in context order, `rows` a page's
/// rows in this store.
TROUPE_HD inline std::int64_t paged_row(const std::int64_t* pages, std::int64_t rows,
                                        std::int64_t g) {
  return pages[g / rows] * rows + g % rows;
}

}  // namespace troupe::kernels::cuda

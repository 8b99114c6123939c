// NumPy .npy files of float32 (format version 1.0, C order), for `--logits-out`.
//
// Anyone comparing troupe's logits with another implementation can `numpy.load` them: the
// file is the 6-byte magic "\x93NUMPY", version 1.0, a little-endian u16 header length, the
// header dict {'descr': '<f4', 'fortran_order': False, 'shape': (...), } padded with spaces to
// a multiple of 64 bytes and ended by '\n', then the values row-major. The reader accepts what
// the writer writes (and the same layout from numpy) and refuses anything else with a reason.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "kernels/result.hpp"

namespace troupe::kernels {

struct npy_array {
  std::vector<std::int64_t> shape;
  std::vector<float> data;  // row-major
};

/// The header block (magic through the terminating '\n') of a float32 C-order array.
std::vector<char> npy_header(std::span<const std::int64_t> shape);

/// Writes `data` (row-major, product of `shape` values) to `path`. Returns the bytes written.
result<std::uint64_t> write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape,
                                std::span<const float> data);

/// Reads a float32 little-endian C-order .npy file (version 1.0 or 2.0).
result<npy_array> read_npy(const std::filesystem::path& path);

}  // namespace troupe::kernels

// Checkpoint weights: a memory-mapped safetensors reader (single file or sharded) and the
// conversions of the released DeepSeek formats (bf16, fp16, fp8 e4m3 with block scales, packed
// fp4 experts) to float32.
//
// A DeepSeek-V4.1 checkpoint is hundreds of gigabytes in many safetensors shards tied together
// by `model.safetensors.index.json`. The forward pass needs each tensor by its released name,
// without copying the file into memory, and must be told exactly what is wrong when a file is
// truncated, a header lies about offsets, or a tensor has another shape or dtype than the
// config implies: the message names the file, the tensor and expected vs found. A malformed
// file must never crash the process (the header parser is fuzzed) and nothing here throws.
//
// Formats (docs/kernels.md gives the sources): dense weights of the released checkpoints are
// F8_E4M3 with a companion scale tensor `<name minus .weight>.scale` of dtype F8_E8M0 (a power of
// two per 128x128 block); DeepSeek-V3-style checkpoints use `<name>_scale_inv` in F32 instead.
// Routed experts are packed FP4 E2M1, two values per byte (low nibble = even column), stored as
// I8 / U8 of shape [rows, cols/2] (or safetensors' F4 of shape [rows, cols]), with an F8_E8M0
// scale per 32 consecutive values of a row, shape [rows, cols/32].
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/result.hpp"

namespace troupe::kernels {

/// The safetensors element types troupe reads (names as in the file's header).
enum class dtype {
  BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64,
  F8_E4M3, F8_E5M2, F8_E8M0,
  F4,  // 4-bit E2M1, two per byte; shape counts elements
};

std::string_view dtype_name(dtype t);
std::optional<dtype> dtype_from_name(std::string_view name);
/// Size of one element in bits (4 for F4, 8 * bytes otherwise).
std::size_t dtype_bits(dtype t);

/// One tensor's entry in a safetensors header; offsets are relative to the data section.
struct tensor_info {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint64_t numel() const;
};

/// A parsed, validated safetensors header.
struct safetensors_header {
  std::uint64_t data_start = 0;  // 8 + header length: where offsets count from
  std::vector<tensor_info> tensors;  // in header order
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

/// Parses and validates the header of a safetensors file held entirely in `bytes`: the length
/// prefix fits, the header is a JSON object, every tensor has a known dtype, a shape of
/// non-negative dimensions and [begin, end) offsets with end - begin == its byte size, inside
/// the data section, aligned to its element size, not overlapping another tensor, and the
/// tensors cover the data section with no hole. `file` names the file in messages. Pure and
/// total: any input gives a header or an error (the fuzz target calls this).
result<safetensors_header> parse_safetensors_header(std::span<const std::byte> bytes,
                                                    std::string_view file);

/// A view of one tensor's bytes inside a mapped file (valid while the file or checkpoint that
/// produced it lives).
struct tensor_view {
  const tensor_info* info = nullptr;
  const std::string* file = nullptr;  // the file it comes from, for messages
  std::span<const std::byte> bytes;

  const std::string& name() const { return info->name; }
  dtype type() const { return info->type; }
  const std::vector<std::int64_t>& shape() const { return info->shape; }
  std::uint64_t numel() const { return info->numel(); }
};

/// One memory-mapped safetensors file.
class safetensors_file {
 public:
  /// Maps `path` read-only and validates its header.
  static result<safetensors_file> open(const std::filesystem::path& path);

  safetensors_file(safetensors_file&&) noexcept;
  safetensors_file& operator=(safetensors_file&&) noexcept;
  ~safetensors_file();

  const std::string& path() const;
  const safetensors_header& header() const;
  /// The tensor of that exact name, or nullopt.
  std::optional<tensor_view> find(std::string_view name) const;

  struct impl;

 private:
  explicit safetensors_file(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Every tensor of a checkpoint: one file, or the shards named by model.safetensors.index.json.
class checkpoint {
 public:
  /// `path` is a directory (its model.safetensors.index.json, else its model.safetensors),
  /// an index .json file, or a single .safetensors file. For an index, every shard it names is
  /// mapped and every weight_map entry must be found in the shard it points to.
  static result<checkpoint> open(const std::filesystem::path& path);

  checkpoint(checkpoint&&) noexcept;
  checkpoint& operator=(checkpoint&&) noexcept;
  ~checkpoint();

  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  std::size_t file_count() const;
  bool contains(std::string_view name) const;

  /// The tensor of that exact name; the error says which files were searched.
  result<tensor_view> get(std::string_view name) const;
  /// The tensor, checked against an expected dtype and shape; the error names the file, the
  /// tensor and expected vs found.
  result<tensor_view> get(std::string_view name, dtype expected_type,
                          const std::vector<std::int64_t>& expected_shape) const;

  /// The tensor as float32 in row-major order, dequantized: an F8_E4M3 tensor with its block
  /// scale companion (`.scale` or `_scale_inv`) is scaled by blocks of `block_rows` x
  /// `block_cols` (the config's `weight_block_size`); a packed FP4 tensor (I8 / U8 / F4 with a
  /// `.scale` companion) is unpacked to its logical [rows, cols] shape. `shape_out`, when
  /// given, receives the logical shape.
  result<std::vector<float>> load_float(std::string_view name,
                                        std::vector<std::int64_t>* shape_out = nullptr,
                                        std::int64_t block_rows = 128,
                                        std::int64_t block_cols = 128) const;

  struct impl;

 private:
  explicit checkpoint(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// --- conversions --------------------------------------------------------------------------------

float bf16_to_float(std::uint16_t bits);
float fp16_to_float(std::uint16_t bits);
float fp8_e4m3_to_float(std::uint8_t bits);  // OCP e4m3fn: no infinities, 0x7f / 0xff are NaN
float fp8_e8m0_to_float(std::uint8_t bits);  // 2^(bits-127); 0xff is NaN
float fp4_e2m1_to_float(std::uint8_t nibble);  // low 4 bits: +-{0, .5, 1, 1.5, 2, 3, 4, 6}

/// An unscaled tensor (F32, F16, BF16, F64, F8_E4M3, F8_E5M2, F8_E8M0, integer types) as float32.
result<std::vector<float>> to_float32(const tensor_view& t);

/// A 2-D F8_E4M3 weight [rows, cols] times its block scales [ceil(rows/br), ceil(cols/bc)]
/// (F8_E8M0, F32 or BF16): w[i][j] * scale[i/br][j/bc].
result<std::vector<float>> dequantize_fp8_blocks(const tensor_view& weight, const tensor_view& scale,
                                                 std::int64_t block_rows = 128,
                                                 std::int64_t block_cols = 128);

/// A packed FP4 weight (I8 / U8 [rows, cols/2], or F4 [rows, cols]) times its scales [rows,
/// cols/block] (F8_E8M0, F32 or BF16): a [rows, cols] float32 matrix.
result<std::vector<float>> dequantize_fp4(const tensor_view& packed, const tensor_view& scale,
                                          std::int64_t block = 32,
                                          std::vector<std::int64_t>* shape_out = nullptr);

// --- writing (tests, model init) -----------------------------------------------------------------

/// A tensor to write: raw little-endian bytes of `numel * bits / 8` bytes.
struct tensor_to_write {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
};

/// Writes a safetensors file: the header padded with spaces to a multiple of 8 bytes, the tensors
/// packed without holes, larger element types first (then by name) so that every tensor is
/// aligned to its element size, as Python's `safetensors` lays them out. Returns the bytes written.
result<std::uint64_t> write_safetensors(const std::filesystem::path& path,
                                        const std::vector<tensor_to_write>& tensors,
                                        const std::map<std::string, std::string>& metadata = {});

}  // namespace troupe::kernels

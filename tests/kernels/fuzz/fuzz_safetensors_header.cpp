// libFuzzer target for the safetensors header parser (and, on headers it accepts, the float32
// conversion of every tensor): any byte string must give a header or an error, never a crash,
// a sanitizer report or a read outside the input. Built only with a compiler that supports
// -fsanitize=fuzzer (see tests/CMakeLists.txt); docs/kernels.md says how to run it.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe::kernels;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto header = parse_safetensors_header(bytes, "fuzz.safetensors");
  if (!header) return 0;
  static const std::string file = "fuzz.safetensors";
  for (const tensor_info& t : header->tensors) {
    if (t.numel() > (1u << 16)) continue;  // keep each input fast
    tensor_view v;
    v.info = &t;
    v.file = &file;
    v.bytes = bytes.subspan(header->data_start + t.begin, t.end - t.begin);
    auto f = to_float32(v);
    (void)f;
  }
  return 0;
}

// Fuzzes a safetensors file's first bytes: the 8-byte header length, the JSON header and its
// tensor table, checked against the data section the remaining bytes form. Every accepted
// tensor must lie inside the data section, match its dtype and shape, and overlap no other.
#include <algorithm>

#include "fuzz_util.h"
#include "model/safetensors.h"

using namespace origami;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Expected<SafetensorsLayout> layout = parse_safetensors_bytes(data, size, "fuzz.safetensors");
  if (!layout) {
    FUZZ_CHECK(!layout.status().message().empty(), "an error without a message");
    return 0;
  }
  FUZZ_CHECK(layout->data_offset >= 8 && layout->data_offset <= size, "data section outside the file");
  const uint64_t data_size = size - layout->data_offset;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const SafetensorsTensorInfo& t : layout->tensors) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= data_size, t.name + ": byte range outside the data section");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0, t.name + ": negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (t.supported) {
      FUZZ_CHECK(numel * dtype_size(t.dtype) == t.end - t.begin, t.name + ": size does not match dtype and shape");
      // What SafetensorsFile::view hands out: touch the first and last byte of the range.
      if (t.end > t.begin) {
        volatile uint8_t first = data[layout->data_offset + t.begin];
        volatile uint8_t last = data[layout->data_offset + t.end - 1];
        (void)first;
        (void)last;
      }
    }
    if (t.end > t.begin) ranges.emplace_back(t.begin, t.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second, "overlapping tensors");
  FUZZ_CHECK(std::is_sorted(layout->tensors.begin(), layout->tensors.end(),
                            [](const auto& a, const auto& b) { return a.name < b.name; }),
             "tensor table not sorted by name");
  return 0;
}

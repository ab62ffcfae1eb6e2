#pragma once
// Writes safetensors files (for calibration outputs, learned gates, and test fixtures).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace origami {

struct SafetensorsWriteEntry {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "BF16", "F16", "I32", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;  // num_bytes bytes, little-endian, row-major
  size_t num_bytes = 0;
};

// Writes the entries in the order given (data offsets follow that order), with the header padded
// to a multiple of 8 bytes so that tensor data stays aligned. For the known dtypes, num_bytes
// must equal numel * element size.
Status write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsWriteEntry>& entries,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace origami

#pragma once
// Reader for the safetensors format: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// data section. Files are memory-mapped; every offset is validated before any view is handed out,
// so a truncated or corrupted file yields an error naming the file (and tensor), never a crash.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/mmap_file.h"
#include "model/weights.h"

namespace origami {

// A header above this size is treated as corruption (the format's own limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;  // as written in the file: "BF16", "I32", ...
  bool supported = false;  // true for F32 / BF16 / F16 / F8_E4M3, the dtypes the engine reads
  DType dtype = DType::kF32;  // meaningful only when `supported`
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
};

// Parses and validates a header: each entry's dtype is a known safetensors dtype, its shape is
// non-negative, its byte range matches dtype size * numel, lies within `data_size` and overlaps no
// other entry. `source` names the file in errors. Result is sorted by name.
Expected<std::vector<SafetensorsTensorInfo>> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                                      const std::string& source,
                                                                      std::map<std::string, std::string>* metadata = nullptr);

// A whole safetensors file's layout: the header length prefix, the header and the byte ranges
// of its tensors within the data section that follows.
struct SafetensorsLayout {
  std::vector<SafetensorsTensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // where the data section starts: 8 + header length
};

// Parses the first bytes of a safetensors file held in memory (`size` bytes from `data`): the
// length prefix, then the header, checked against the data section that the rest of the bytes
// form. SafetensorsFile::open maps the file and calls this.
Expected<SafetensorsLayout> parse_safetensors_bytes(const uint8_t* data, uint64_t size, const std::string& source);

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static Expected<std::unique_ptr<SafetensorsFile>> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsTensorInfo* find(std::string_view name) const;
  // A view of the tensor's bytes; not_found when absent, invalid_file when its dtype is not one
  // the engine computes with (the message names the tensor, dtype and file).
  Expected<TensorView> view(std::string_view name) const;

 private:
  MappedFile file_;
  const uint8_t* data_section_ = nullptr;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder: the shards named by model.safetensors.index.json, else
// model.safetensors, else every *.safetensors in the folder. Owns the mappings, so it doubles
// as the storage behind a ModelWeights' views.
class SafetensorsCheckpoint : public WeightStorage {
 public:
  static Expected<std::shared_ptr<SafetensorsCheckpoint>> open(const std::filesystem::path& model_dir);

  bool contains(std::string_view name) const { return tensor_file_.count(std::string(name)) != 0; }
  // The file holding `name`, or nullptr.
  const SafetensorsFile* file_of(std::string_view name) const;
  Expected<TensorView> tensor(std::string_view name) const;
  std::vector<std::string> tensor_names() const;  // sorted
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // What was read, for error messages: the index file or the single weights file.
  const std::string& source() const { return source_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, size_t> tensor_file_;  // tensor name -> index into files_
  std::string source_;
};

}  // namespace origami

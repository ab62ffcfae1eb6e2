#pragma once
// A read-only memory map of a whole file. Weights stay in the page cache and are shared between
// processes; nothing is copied until a backend converts a tensor.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "core/status.h"

namespace origami {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps `path` read-only. An empty file maps to size() == 0 and data() == nullptr.
  static Expected<MappedFile> open(const std::filesystem::path& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void release();

  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace origami

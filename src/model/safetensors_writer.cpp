#include "model/safetensors_writer.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace origami {

Status write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsWriteEntry>& entries,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : entries) {
    if (e.name.empty() || e.name == "__metadata__") return invalid_argument(path.string() + ": bad tensor name '" + e.name + "'");
    if (header.contains(e.name)) return invalid_argument(path.string() + ": duplicate tensor '" + e.name + "'");
    DType dt;
    if (parse_dtype(e.dtype, &dt) && (e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16" || e.dtype == "F8_E4M3")) {
      uint64_t numel = 1;
      for (int64_t d : e.shape) numel *= static_cast<uint64_t>(d);
      if (numel * dtype_size(dt) != e.num_bytes) {
        return invalid_argument(path.string() + ": tensor '" + e.name + "' has " + std::to_string(e.num_bytes) +
                                " bytes, its shape needs " + std::to_string(numel * dtype_size(dt)));
      }
    }
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.num_bytes}}};
    offset += e.num_bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return invalid_argument(path.string() + ": cannot open for writing");
  const uint64_t len = text.size();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
  out.write(reinterpret_cast<const char*>(len_bytes), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& e : entries) {
    if (e.num_bytes > 0) out.write(static_cast<const char*>(e.data), static_cast<std::streamsize>(e.num_bytes));
  }
  out.close();
  if (!out) return invalid_argument(path.string() + ": write failed");
  return Status::ok();
}

}  // namespace origami

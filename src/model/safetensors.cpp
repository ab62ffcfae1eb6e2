#include "model/safetensors.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/json_excerpt.h"
#include "core/json_parse.h"

namespace origami {
namespace {

using json = nlohmann::json;

// Element sizes of every byte-addressable safetensors dtype, so that a file holding e.g. I32 or
// I64 buffers can still be validated; only F32/BF16/F16 can be viewed.
int known_dtype_size(const std::string& name) {
  static const std::unordered_map<std::string, int> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},     {"C64", 8},
  };
  auto it = kSizes.find(name);
  return it == kSizes.end() ? 0 : it->second;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Expected<uint64_t> read_u64(const json& v, const std::string& what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    return invalid_file(what + " must be a non-negative integer, got " + json_excerpt(v));
  }
  return v.get<uint64_t>();
}

Expected<SafetensorsTensorInfo> parse_entry(const std::string& name, const json& e, uint64_t data_size,
                                            const std::string& source) {
  const std::string where = source + ": tensor '" + name + "'";
  if (!e.is_object()) return invalid_file(where + ": header entry is not an object");
  SafetensorsTensorInfo info;
  info.name = name;

  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) return invalid_file(where + ": missing or non-string 'dtype'");
  info.dtype_name = dt->get<std::string>();
  const int elem_size = known_dtype_size(info.dtype_name);
  if (elem_size == 0) return invalid_file(where + ": unsupported dtype '" + info.dtype_name + "'");
  info.supported = (info.dtype_name == "F32" || info.dtype_name == "BF16" || info.dtype_name == "F16" ||
                    info.dtype_name == "F8_E4M3") &&
                   parse_dtype(info.dtype_name, &info.dtype);

  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) return invalid_file(where + ": missing or non-list 'shape'");
  uint64_t numel = 1;
  for (const json& d : *sh) {
    ORIGAMI_ASSIGN_OR_RETURN(uint64_t dim, read_u64(d, where + ": shape dimension"));
    if (dim > static_cast<uint64_t>(INT64_MAX)) return invalid_file(where + ": shape dimension too large");
    info.shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, dim, &numel)) return invalid_file(where + ": shape overflows");
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(elem_size), &expected_bytes)) {
    return invalid_file(where + ": shape overflows");
  }

  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2) {
    return invalid_file(where + ": 'data_offsets' must be a list [begin, end]");
  }
  ORIGAMI_ASSIGN_OR_RETURN(info.begin, read_u64((*off)[0], where + ": data_offsets[0]"));
  ORIGAMI_ASSIGN_OR_RETURN(info.end, read_u64((*off)[1], where + ": data_offsets[1]"));
  if (info.end < info.begin) {
    return invalid_file(where + ": data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                        "] end before begin");
  }
  if (info.end - info.begin != expected_bytes) {
    return invalid_file(where + ": data_offsets span " + std::to_string(info.end - info.begin) + " bytes but " +
                        info.dtype_name + " " + shape_string(info.shape) + " needs " +
                        std::to_string(expected_bytes));
  }
  if (info.end > data_size) {
    return invalid_file(where + ": data_offsets end " + std::to_string(info.end) +
                        " is past the end of the data section (" + std::to_string(data_size) +
                        " bytes; file truncated?)");
  }
  return info;
}

// Shard names come from a file; keep them inside the model folder.
bool is_plain_relative(const std::string& name) {
  if (name.empty()) return false;
  const std::filesystem::path p(name);
  if (p.is_absolute()) return false;
  for (const auto& part : p) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

Expected<std::vector<SafetensorsTensorInfo>> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                                      const std::string& source,
                                                                      std::map<std::string, std::string>* metadata) {
  Expected<json> parsed = parse_json(header_json, kFileJsonMaxDepth);
  if (!parsed) return invalid_file(source + ": safetensors header: " + parsed.status().message() + " (corrupted file?)");
  const json header = std::move(*parsed);
  if (!header.is_object()) return invalid_file(source + ": safetensors header is not a JSON object");

  std::vector<SafetensorsTensorInfo> tensors;
  tensors.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return invalid_file(source + ": '__metadata__' is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return invalid_file(source + ": '__metadata__." + m.key() + "' is not a string");
        if (metadata != nullptr) (*metadata)[m.key()] = m->get<std::string>();
      }
      continue;
    }
    ORIGAMI_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, parse_entry(it.key(), *it, data_size, source));
    tensors.push_back(std::move(info));
  }

  // Overlapping byte ranges would alias two tensors; reject them (empty tensors overlap nothing).
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& t : tensors) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return invalid_file(source + ": tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                          "' have overlapping data_offsets");
    }
  }
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return tensors;
}

Expected<SafetensorsLayout> parse_safetensors_bytes(const uint8_t* data, uint64_t size, const std::string& source) {
  if (size < 8) {
    return invalid_file(source + ": file is " + std::to_string(size) +
                        " bytes, too short for a safetensors header (truncated?)");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];  // little-endian
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return invalid_file(source + ": safetensors header length " + std::to_string(header_len) +
                        " is implausibly large (corrupted file?)");
  }
  if (header_len > size - 8) {
    return invalid_file(source + ": safetensors header length " + std::to_string(header_len) +
                        " exceeds the file size " + std::to_string(size) + " (truncated or corrupted file)");
  }
  const std::string_view header(reinterpret_cast<const char*>(data) + 8, header_len);
  if (header.empty() || header.front() != '{') {
    return invalid_file(source + ": safetensors header does not start with '{' (corrupted file?)");
  }
  SafetensorsLayout layout;
  ORIGAMI_ASSIGN_OR_RETURN(layout.tensors,
                           parse_safetensors_header(header, size - 8 - header_len, source, &layout.metadata));
  layout.data_offset = 8 + header_len;
  return layout;
}

Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::filesystem::path& path) {
  ORIGAMI_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  ORIGAMI_ASSIGN_OR_RETURN(SafetensorsLayout layout, parse_safetensors_bytes(mapped.data(), mapped.size(), path.string()));
  auto file = std::make_unique<SafetensorsFile>();
  file->tensors_ = std::move(layout.tensors);
  file->metadata_ = std::move(layout.metadata);
  file->data_section_ = mapped.data() + layout.data_offset;
  file->file_ = std::move(mapped);
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_.emplace(file->tensors_[i].name, i);
  return file;
}

const SafetensorsTensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Expected<TensorView> SafetensorsFile::view(std::string_view name) const {
  const SafetensorsTensorInfo* info = find(name);
  if (info == nullptr) return not_found(path().string() + ": no tensor '" + std::string(name) + "'");
  if (!info->supported) {
    return invalid_file(path().string() + ": tensor '" + info->name + "' has unsupported dtype " + info->dtype_name +
                        " (supported: F32, BF16, F16, F8_E4M3)");
  }
  TensorView v;
  v.name = info->name;
  v.dtype = info->dtype;
  v.shape = info->shape;
  v.data = data_section_ + info->begin;
  return v;
}

Expected<std::shared_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::open(const std::filesystem::path& model_dir) {
  std::error_code ec;
  auto ckpt = std::make_shared<SafetensorsCheckpoint>();
  const std::filesystem::path index_path = model_dir / "model.safetensors.index.json";
  const std::filesystem::path single_path = model_dir / "model.safetensors";

  if (std::filesystem::is_regular_file(index_path, ec)) {
    const std::string source = index_path.string();
    ckpt->source_ = source;
    ORIGAMI_ASSIGN_OR_RETURN(const std::string text, read_file(index_path));
    Expected<json> parsed = parse_json(text, kFileJsonMaxDepth);
    if (!parsed) return invalid_file(source + ": " + parsed.status().message());
    json index = std::move(*parsed);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return invalid_file(source + ": field 'weight_map' is missing or not an object");
    }
    std::map<std::string, size_t> shard_index;  // shard file name -> index into files_
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it->is_string() || !is_plain_relative(it->get<std::string>())) {
        return invalid_file(source + ": weight_map entry for tensor '" + it.key() +
                            "' must be a file name inside the model folder, got " + it->dump());
      }
      const std::string shard = it->get<std::string>();
      auto [pos, inserted] = shard_index.emplace(shard, ckpt->files_.size());
      if (inserted) {
        const std::filesystem::path shard_path = model_dir / shard;
        if (!std::filesystem::exists(shard_path, ec)) {
          return not_found(shard_path.string() + ": shard listed in " + source + " (for tensor '" + it.key() +
                           "') does not exist");
        }
        ORIGAMI_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(shard_path));
        ckpt->files_.push_back(std::move(file));
      }
      const SafetensorsFile& file = *ckpt->files_[pos->second];
      if (file.find(it.key()) == nullptr) {
        return invalid_file(source + ": tensor '" + it.key() + "' is mapped to " + file.path().string() +
                            ", which does not contain it");
      }
      ckpt->tensor_file_.emplace(it.key(), pos->second);
    }
    return ckpt;
  }

  std::vector<std::filesystem::path> paths;
  if (std::filesystem::is_regular_file(single_path, ec)) {
    paths.push_back(single_path);
    ckpt->source_ = single_path.string();
  } else if (std::filesystem::is_directory(model_dir, ec)) {
    for (const auto& entry : std::filesystem::directory_iterator(model_dir, ec)) {
      if (entry.path().extension() == ".safetensors") paths.push_back(entry.path());
    }
    std::sort(paths.begin(), paths.end());
    ckpt->source_ = model_dir.string();
  }
  if (paths.empty()) {
    return not_found(model_dir.string() + ": no model.safetensors, model.safetensors.index.json or *.safetensors");
  }
  for (const auto& path : paths) {
    ORIGAMI_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
    const size_t file_idx = ckpt->files_.size();
    for (const auto& t : file->tensors()) {
      auto [it, inserted] = ckpt->tensor_file_.emplace(t.name, file_idx);
      if (!inserted) {
        return invalid_file(path.string() + ": tensor '" + t.name + "' also appears in " +
                            ckpt->files_[it->second]->path().string());
      }
    }
    ckpt->files_.push_back(std::move(file));
  }
  return ckpt;
}

const SafetensorsFile* SafetensorsCheckpoint::file_of(std::string_view name) const {
  auto it = tensor_file_.find(std::string(name));
  return it == tensor_file_.end() ? nullptr : files_[it->second].get();
}

Expected<TensorView> SafetensorsCheckpoint::tensor(std::string_view name) const {
  const SafetensorsFile* file = file_of(name);
  if (file == nullptr) return not_found(source_ + ": no tensor '" + std::string(name) + "'");
  return file->view(name);
}

std::vector<std::string> SafetensorsCheckpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensor_file_.size());
  for (const auto& [name, idx] : tensor_file_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace origami

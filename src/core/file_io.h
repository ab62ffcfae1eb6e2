#pragma once
// Reading whole files (config.json, tokenizer.json, safetensors headers' companions), with errors
// that name the path, so that every loader reports a missing or unreadable file the same way.
#include <filesystem>
#include <string>

#include "core/status.h"

namespace origami {

// The file's bytes. Errors: not_found "<path>: cannot open file (<reason>)", invalid_file
// "<path>: read error" when reading fails part way, invalid_file "<path>: is a directory".
Expected<std::string> read_file(const std::filesystem::path& path);

}  // namespace origami

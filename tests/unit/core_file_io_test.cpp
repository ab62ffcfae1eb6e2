// The one whole-file reader (config.json, tokenizer.json, safetensors index) and the host-memory
// check that loaders run before allocating.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "core/file_io.h"
#include "core/host_memory.h"

namespace origami {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("origami_core_file_io_" + std::to_string(::getpid()) + "_" + name);
}

TEST(CoreFileIo, ReadsTheWholeFileIncludingNulBytes) {
  const fs::path p = temp_path("data.bin");
  const std::string bytes = std::string("abc\0def\n", 8) + std::string(100000, 'x');
  { std::ofstream(p, std::ios::binary) << bytes; }
  Expected<std::string> got = read_file(p);
  ASSERT_TRUE(got.has_value()) << got.status().message();
  EXPECT_EQ(*got, bytes);
  fs::remove(p);
}

TEST(CoreFileIo, MissingFileNamesThePath) {
  const fs::path p = temp_path("missing.json");
  Expected<std::string> got = read_file(p);
  ASSERT_FALSE(got.has_value());
  EXPECT_EQ(got.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(got.status().message().find(p.string() + ": cannot open file"), std::string::npos) << got.status().message();
}

TEST(CoreFileIo, FolderIsAnErrorNotAnEmptyFile) {
  const fs::path dir = temp_path("folder");
  fs::create_directories(dir);
  Expected<std::string> got = read_file(dir);
  ASSERT_FALSE(got.has_value());
  EXPECT_NE(got.status().message().find("is a directory"), std::string::npos) << got.status().message();
  fs::remove_all(dir);
}

TEST(CoreHostMemory, AbsurdRequestsAreRefusedWithBothSizes) {
  ASSERT_GT(available_host_memory_bytes(), 0) << "/proc/meminfo should be readable on Linux";
  Status st = check_host_memory(1e18, "a test allocation");
  EXPECT_EQ(st.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(st.message().find("a test allocation needs about 888.2 PiB"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("of host memory is available"), std::string::npos) << st.message();
  EXPECT_TRUE(check_host_memory(4096, "a page").is_ok());
}

TEST(CoreHostMemory, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512 bytes");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(3.0 * (1ull << 30)), "3.0 GiB");
}

}  // namespace
}  // namespace origami

#include <gtest/gtest.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "model_test_util.h"

namespace origami {
namespace {

using testing::message_has;
using testing::TempDir;
using testing::write_raw_safetensors;

Status open_error(const std::filesystem::path& path) {
  auto f = SafetensorsFile::open(path);
  return f.has_value() ? Status::ok() : f.status();
}

TEST(Safetensors, WriterRoundTrip) {
  TempDir dir;
  const std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 5.0f, -6.0f};
  const std::vector<uint16_t> b = {f32_to_bf16(0.5f), f32_to_bf16(-1.0f), f32_to_bf16(2.0f)};
  const std::vector<uint16_t> c = {f32_to_f16(0.25f), f32_to_f16(-4.0f)};
  const std::vector<int32_t> d = {1, 2, 3};
  const auto path = dir.path() / "t.safetensors";
  ASSERT_TRUE(write_safetensors(path,
                                {{"a", "F32", {2, 3}, a.data(), 24},
                                 {"b", "BF16", {3}, b.data(), 6},
                                 {"c", "F16", {1, 2}, c.data(), 4},
                                 {"d", "I32", {3}, d.data(), 12},
                                 {"empty", "F32", {0, 4}, nullptr, 0}},
                                {{"format", "pt"}})
                  .is_ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.has_value()) << f.status().message();
  EXPECT_EQ((*f)->tensors().size(), 5u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");

  auto va = (*f)->view("a");
  ASSERT_TRUE(va.has_value());
  EXPECT_EQ(va->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(va->dtype, DType::kF32);
  EXPECT_EQ(va->numel(), 6);
  EXPECT_EQ(va->to_f32(), a);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(va->data) % 8, 0u);  // header padded to keep data aligned
  EXPECT_EQ((*f)->view("b")->to_f32(), (std::vector<float>{0.5f, -1.0f, 2.0f}));
  EXPECT_EQ((*f)->view("c")->to_f32(), (std::vector<float>{0.25f, -4.0f}));
  EXPECT_EQ((*f)->view("empty")->numel(), 0);

  // I32 is a valid safetensors dtype (the file opens) but cannot be viewed as a weight.
  const SafetensorsTensorInfo* info = (*f)->find("d");
  ASSERT_NE(info, nullptr);
  EXPECT_FALSE(info->supported);
  EXPECT_EQ(info->dtype_name, "I32");
  auto vd = (*f)->view("d");
  ASSERT_FALSE(vd.has_value());
  EXPECT_TRUE(message_has(vd.status(), {"'d'", "I32", path.string()}));
  EXPECT_TRUE(message_has((*f)->view("zzz").status(), {"zzz", path.string()}));
}

TEST(Safetensors, RealFilesParse) {
  auto f = SafetensorsFile::open(testing::stories_dir() / "model.safetensors");
  ASSERT_TRUE(f.has_value()) << f.status().message();
  // 5 layers * 9 tensors + embeddings + final norm; tied, so no lm_head.
  EXPECT_EQ((*f)->tensors().size(), 47u);
  auto ckpt = SafetensorsCheckpoint::open(testing::tiny_qwen3_dir());
  ASSERT_TRUE(ckpt.has_value()) << ckpt.status().message();
  EXPECT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ((*ckpt)->tensor_names().size(), 6u * 11 + 2);
  EXPECT_NE((*ckpt)->file_of("model.norm.weight")->path().filename().string().find("00002"), std::string::npos);
}

TEST(Safetensors, MissingFile) {
  TempDir dir;
  const Status st = open_error(dir.path() / "absent.safetensors");
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_TRUE(message_has(st, {"absent.safetensors"}));
  auto ckpt = SafetensorsCheckpoint::open(dir.path());
  EXPECT_TRUE(message_has(ckpt.status(), {dir.path().string(), "model.safetensors"}));
}

TEST(Safetensors, TruncatedRealFile) {
  TempDir dir;
  const std::string bytes = testing::read_bytes(testing::stories_dir() / "model.safetensors");
  const auto path = dir.path() / "model.safetensors";
  // Cut inside the data section: the last tensors' offsets run past the end.
  testing::write_text(path, bytes.substr(0, bytes.size() - 1000));
  Status st = open_error(path);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidFile);
  EXPECT_TRUE(message_has(st, {path.string(), "model.", "past the end"}));
  // Cut inside the header.
  testing::write_text(path, bytes.substr(0, 100));
  EXPECT_TRUE(message_has(open_error(path), {path.string(), "header length"}));
  // Cut inside the length prefix.
  testing::write_text(path, bytes.substr(0, 5));
  EXPECT_TRUE(message_has(open_error(path), {path.string(), "too short"}));
  testing::write_text(path, "");
  EXPECT_TRUE(message_has(open_error(path), {path.string(), "too short"}));
}

TEST(Safetensors, CorruptedHeader) {
  TempDir dir;
  const auto path = dir.path() / "bad.safetensors";
  write_raw_safetensors(path, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})", std::string(8, '\0'));
  EXPECT_TRUE(message_has(open_error(path), {path.string(), "JSON"}));
  write_raw_safetensors(path, "[1, 2, 3]", "");
  EXPECT_TRUE(message_has(open_error(path), {path.string()}));
  // Header length larger than the file.
  write_raw_safetensors(path, 5000, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", "abcd");
  EXPECT_TRUE(message_has(open_error(path), {path.string(), "5000", "exceeds the file size"}));
  // Implausibly large length (e.g. random bytes in the prefix).
  write_raw_safetensors(path, 1ull << 60, "{}", "");
  EXPECT_TRUE(message_has(open_error(path), {path.string(), "header length"}));
}

TEST(Safetensors, InvalidEntries) {
  TempDir dir;
  const auto path = dir.path() / "bad.safetensors";
  auto check = [&](const std::string& header, const std::string& data, std::vector<std::string> parts) {
    SCOPED_TRACE(header);
    write_raw_safetensors(path, header, data);
    parts.push_back(path.string());
    EXPECT_TRUE(message_has(open_error(path), parts));
  };
  const std::string d16(16, '\0');
  // Offsets inconsistent with dtype * shape.
  check(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", d16, {"'w'", "needs 12"});
  // Out of range.
  check(R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", d16, {"'w'", "past the end"});
  // Overlapping.
  check(R"({"u": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
        d16, {"'u'", "'w'", "overlapping"});
  // Reversed.
  check(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", d16, {"'w'", "end before begin"});
  // Unknown dtype.
  check(R"({"w": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 8]}})", d16, {"'w'", "Q4_K"});
  // Negative dimension, missing fields.
  check(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", d16, {"'w'", "shape"});
  check(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", d16, {"'w'", "shape"});
  check(R"({"w": {"dtype": "F32", "shape": [1]}})", d16, {"'w'", "data_offsets"});
  check(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", d16, {"'w'", "dtype"});
  // Shape product overflowing 64 bits.
  check(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", d16,
        {"'w'", "overflow"});
  // Valid: adjacent ranges, zero-size tensor anywhere.
  write_raw_safetensors(path,
                        R"({"u": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "z": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                            "w": {"dtype": "BF16", "shape": [4], "data_offsets": [8, 16]}})",
                        d16);
  EXPECT_TRUE(open_error(path).is_ok()) << open_error(path).message();
}

// Copies the tiny Qwen3 folder's weight files (and index) into a temp folder for editing.
void copy_sharded(const std::filesystem::path& to) {
  for (const char* name : {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors"}) {
    std::filesystem::copy_file(testing::tiny_qwen3_dir() / name, to / name);
  }
}

TEST(Safetensors, MissingShard) {
  TempDir dir;
  copy_sharded(dir.path());
  std::filesystem::remove(dir.path() / "model-00002-of-00002.safetensors");
  auto ckpt = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(ckpt.has_value());
  EXPECT_EQ(ckpt.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(message_has(ckpt.status(), {"model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                          "model.layers.5."}));
}

TEST(Safetensors, IndexInconsistentWithShard) {
  TempDir dir;
  copy_sharded(dir.path());
  const auto index_path = dir.path() / "model.safetensors.index.json";
  std::ifstream in(index_path);
  nlohmann::json index = nlohmann::json::parse(in);
  in.close();
  // Point a tensor at the shard that does not hold it.
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  testing::write_text(index_path, index.dump());
  auto ckpt = SafetensorsCheckpoint::open(dir.path());
  EXPECT_TRUE(message_has(ckpt.status(), {"model.norm.weight", "model-00001-of-00002.safetensors", "index"}));
  // A shard path escaping the folder.
  index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  testing::write_text(index_path, index.dump());
  EXPECT_TRUE(message_has(SafetensorsCheckpoint::open(dir.path()).status(), {"model.norm.weight", "elsewhere"}));
  testing::write_text(index_path, "{\"weight_map\": 3}");
  EXPECT_TRUE(message_has(SafetensorsCheckpoint::open(dir.path()).status(), {"index.json", "weight_map"}));
  testing::write_text(index_path, "{oops");
  EXPECT_TRUE(message_has(SafetensorsCheckpoint::open(dir.path()).status(), {"index.json", "JSON"}));
}

TEST(Safetensors, UnindexedShardsAndDuplicates) {
  TempDir dir;
  const std::vector<float> x = {1, 2};
  ASSERT_TRUE(write_safetensors(dir.path() / "a.safetensors", {{"x", "F32", {2}, x.data(), 8}}).is_ok());
  ASSERT_TRUE(write_safetensors(dir.path() / "b.safetensors", {{"y", "F32", {2}, x.data(), 8}}).is_ok());
  auto ckpt = SafetensorsCheckpoint::open(dir.path());
  ASSERT_TRUE(ckpt.has_value()) << ckpt.status().message();
  EXPECT_EQ((*ckpt)->tensor_names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ((*ckpt)->tensor("y")->to_f32(), x);
  ASSERT_TRUE(write_safetensors(dir.path() / "c.safetensors", {{"x", "F32", {2}, x.data(), 8}}).is_ok());
  EXPECT_TRUE(message_has(SafetensorsCheckpoint::open(dir.path()).status(), {"'x'", "a.safetensors", "c.safetensors"}));
}

// Random single-byte corruptions of a real file must give an error or a valid file, never a crash.
TEST(Safetensors, ByteFlipsNeverCrash) {
  TempDir dir;
  const std::string bytes = testing::read_bytes(testing::stories_dir() / "model.safetensors");
  const auto path = dir.path() / "model.safetensors";
  uint64_t state = 12345;
  int num_errors = 0;
  for (int trial = 0; trial < 200; ++trial) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::string copy = bytes.substr(0, 8 + 4856);  // the header is where parsing can go wrong
    const size_t pos = (state >> 33) % copy.size();
    copy[pos] = static_cast<char>(copy[pos] ^ static_cast<char>(1 + ((state >> 20) % 255)));
    testing::write_text(path, copy + bytes.substr(copy.size()));
    auto f = SafetensorsFile::open(path);
    if (!f.has_value()) {
      ++num_errors;
      EXPECT_TRUE(message_has(f.status(), {path.string()}));
    }
  }
  EXPECT_GT(num_errors, 50);
}

}  // namespace
}  // namespace origami

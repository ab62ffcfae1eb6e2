// Bad inputs to the CPU backend and the factory come back as a Status naming what is wrong,
// never a crash; and copy_block copies a page of every layer.
#include <cstring>

#include "backend_cpu_test_util.h"

namespace origami::test {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.arch = Architecture::kQwen3;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  return c;
}

bool contains(const Status& st, const std::string& text) { return st.message().find(text) != std::string::npos; }

TEST(CpuBackendFactory, CreatesCpuAndRejectsOthers) {
  BackendOptions options;
  auto cpu = create_backend(options);
  ASSERT_TRUE(cpu.has_value()) << cpu.status().to_string();
  EXPECT_EQ((*cpu)->name(), "cpu");
#if !defined(ORIGAMI_HAVE_CUDA)
  options.device = "cuda";
  auto cuda = create_backend(options);
  ASSERT_FALSE(cuda.has_value());
  EXPECT_TRUE(contains(cuda.status(), "built without CUDA (-DORIGAMI_CUDA=ON)")) << cuda.status().to_string();
#endif
  options.device = "tpu";
  auto tpu = create_backend(options);
  ASSERT_FALSE(tpu.has_value());
  EXPECT_TRUE(contains(tpu.status(), "'tpu'"));
  options.device = "cpu";
  options.num_threads = -1;
  EXPECT_FALSE(create_backend(options).has_value());
}

TEST(CpuBackendErrors, LoadNamesTheBadTensor) {
  const ModelConfig c = tiny_config();
  ModelWeights w = make_dummy_weights(c, DType::kF32, 1);
  w.layers[1].k_proj.shape = {3, 32};
  CpuBackend backend(BackendOptions{});
  Status st = backend.load(c, w);
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, w.layers[1].k_proj.name)) << st.to_string();
  EXPECT_TRUE(contains(st, "[3, 32]")) << st.to_string();
}

TEST(CpuBackendErrors, KvLayoutChecks) {
  const ModelConfig c = tiny_config();
  CpuBackend backend(BackendOptions{});
  ASSERT_TRUE(backend.load(c, make_dummy_weights(c, DType::kF32, 1)).is_ok());
  // The CPU cache stores float32, or emulates a bfloat16 cache by rounding every entry it writes
  // (--kv-cache-dtype); float16 is neither.
  Status st = backend.allocate_kv_cache(KVLayout::full(2, 2, 8, 16, 8, DType::kF16));
  EXPECT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, "float32 or bfloat16")) << st.to_string();
  EXPECT_TRUE(backend.allocate_kv_cache(KVLayout::full(2, 2, 8, 16, 8, DType::kBF16)).is_ok());
  st = backend.allocate_kv_cache(KVLayout::full(3, 2, 8, 16, 8, DType::kF32));
  EXPECT_FALSE(st.is_ok());  // layer count differs from the model
  KVLayout two = KVLayout::full(2, 2, 8, 16, 8, DType::kF32);
  two.groups.push_back(two.groups[0]);
  st = backend.allocate_kv_cache(two);
  EXPECT_EQ(st.code(), ErrorCode::kUnimplemented) << st.to_string();
  EXPECT_TRUE(backend.allocate_kv_cache(KVLayout::full(2, 2, 8, 16, 8, DType::kF32)).is_ok());
  EXPECT_EQ(backend.available_kv_bytes(12345), 12345u);
  EXPECT_GT(backend.available_kv_bytes(0), 0u);
}

class CpuExecuteErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelConfig c = tiny_config();
    ASSERT_TRUE(backend_.load(c, make_dummy_weights(c, DType::kF32, 3)).is_ok());
    greedy_.temperature = 0.0f;
  }
  ForwardBatch good_batch() {
    ForwardBatch b;
    b.token_ids = {1, 2, 3};
    b.positions = {0, 1, 2};
    SequenceInput in;
    in.num_query_tokens = 3;
    in.block_table = &table_;
    in.sampling = &greedy_;
    b.sequences.push_back(in);
    return b;
  }
  Status run(const ForwardBatch& b) {
    StepOutput out;
    return backend_.execute(b, &out);
  }
  CpuBackend backend_{BackendOptions{}};
  std::vector<BlockId> table_ = {3};
  SamplingParams greedy_;
};

TEST_F(CpuExecuteErrors, RejectsMalformedBatches) {
  EXPECT_FALSE(run(good_batch()).is_ok());  // no KV cache yet
  ASSERT_TRUE(backend_.allocate_kv_cache(KVLayout::full(2, 2, 8, 4, 8, DType::kF32)).is_ok());
  ASSERT_TRUE(run(good_batch()).is_ok());

  ForwardBatch b = good_batch();
  b.token_ids[1] = 50;
  Status st = run(b);
  EXPECT_TRUE(contains(st, "token id 50")) << st.to_string();
  b = good_batch();
  b.positions.pop_back();
  EXPECT_FALSE(run(b).is_ok());
  b = good_batch();
  b.sequences[0].block_table = nullptr;
  EXPECT_TRUE(contains(run(b), "no block table"));
  b = good_batch();
  b.sequences[0].num_cached_entries = 2;  // 5 entries need 2 pages of 4
  st = run(b);
  EXPECT_TRUE(contains(st, "need 2")) << st.to_string();
  std::vector<BlockId> null_table = {kNullBlock};
  b = good_batch();
  b.sequences[0].block_table = &null_table;
  EXPECT_FALSE(run(b).is_ok());
  std::vector<BlockId> far_table = {8};
  b.sequences[0].block_table = &far_table;
  EXPECT_FALSE(run(b).is_ok());
  b = good_batch();
  b.sequences[0].sampling = nullptr;
  EXPECT_TRUE(contains(run(b), "sampling"));
  b.sequences[0].logits_mode = LogitsMode::kNone;  // nothing to sample: no parameters needed
  EXPECT_TRUE(run(b).is_ok());
  b = good_batch();
  b.sequences.push_back(b.sequences[0]);  // two sequences claiming the same tokens
  EXPECT_FALSE(run(b).is_ok());
  b = good_batch();
  b.sequences[0].num_query_tokens = 4;
  EXPECT_FALSE(run(b).is_ok());
}

TEST_F(CpuExecuteErrors, CopyBlockCopiesEveryLayer) {
  ASSERT_TRUE(backend_.allocate_kv_cache(KVLayout::full(2, 2, 8, 4, 8, DType::kF32)).is_ok());
  ASSERT_TRUE(run(good_batch()).is_ok());  // fills 3 entries of block 3
  backend_.copy_block(0, 3, 6);
  auto& kv = backend_.kv_cache();
  for (int layer = 0; layer < 2; ++layer)
    for (int head = 0; head < 2; ++head)
      for (int off = 0; off < 3; ++off) {
        EXPECT_EQ(0, std::memcmp(kv.key_at(layer, 3, head, off), kv.key_at(layer, 6, head, off), 8 * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(kv.value_at(layer, 3, head, off), kv.value_at(layer, 6, head, off), 8 * sizeof(float)));
        EXPECT_NE(kv.key_at(layer, 6, head, off)[0], 0.0f);
      }
}

}  // namespace
}  // namespace origami::test

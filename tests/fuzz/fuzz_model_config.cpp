// Fuzzes config.json: a config that parses must satisfy what the loaders and backends assume
// (positive sizes, heads divisible by KV heads, even head_dim, q_size within int, token ids
// below vocab_size, finite positive rms_norm_eps and RoPE theta).
#include <cmath>
#include <string>

#include "fuzz_util.h"
#include "model/config.h"

using namespace origami;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(fuzz::as_text(data, size));
  Expected<ModelConfig> c = parse_model_config(text, "config.json");
  if (!c) {
    FUZZ_CHECK(c.status().message().rfind("config.json", 0) == 0, "error does not name the file: " + c.status().message());
    return 0;
  }
  FUZZ_CHECK(c->vocab_size > 0 && c->hidden_size > 0 && c->intermediate_size > 0 && c->num_layers > 0 &&
                 c->num_heads > 0 && c->num_kv_heads > 0 && c->head_dim > 0 && c->max_position_embeddings > 0,
             "a size is not positive");
  FUZZ_CHECK(c->num_heads % c->num_kv_heads == 0, "heads not divisible by KV heads");
  FUZZ_CHECK(c->head_dim % 2 == 0, "odd head_dim");
  FUZZ_CHECK(static_cast<int64_t>(c->num_heads) * c->head_dim == c->q_size(), "q_size overflows");
  FUZZ_CHECK(c->kv_size() > 0 && c->kv_size() <= c->q_size(), "kv_size out of range");
  FUZZ_CHECK(c->rms_norm_eps > 0 && std::isfinite(c->rms_norm_eps), "rms_norm_eps");
  FUZZ_CHECK(c->bos_token_id >= -1 && c->bos_token_id < c->vocab_size, "bos_token_id");
  for (int id : c->eos_token_ids) FUZZ_CHECK(id >= 0 && id < c->vocab_size, "eos_token_id");
  (void)c->num_parameters();
  return 0;
}

// Tokenizer throughput on a long text: load time, encode tokens/s (cold and warm word cache),
// decode and streaming-decode tokens/s.
//
// Built with the project (target tokenizer_bench). Run from the repository root:
//   build/tokenizer_bench [tokenizer_dir] [text_file]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

using origami::StreamingDecoder;
using origami::Tokenizer;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "../shared/tokenizers/qwen3";
  const std::string file = argc > 2 ? argv[2] : "../shared/data/wikitext2_test_dev.txt";
  auto t0 = std::chrono::steady_clock::now();
  auto loaded = Tokenizer::load(dir);
  if (!loaded) {
    std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str());
    return 1;
  }
  std::shared_ptr<const Tokenizer> tok = *loaded;
  std::printf("load: %.3f s (%s, vocab %d)\n", seconds_since(t0), dir.c_str(), tok->vocab_size());

  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", file.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  std::vector<int32_t> ids;
  for (const char* pass : {"cold cache", "warm cache"}) {
    t0 = std::chrono::steady_clock::now();
    ids = tok->encode(text, false);
    const double s = seconds_since(t0);
    std::printf("encode (%s): %zu bytes -> %zu tokens in %.3f s: %.2f M tokens/s, %.1f MB/s\n", pass, text.size(),
                ids.size(), s, ids.size() / s / 1e6, text.size() / s / 1e6);
  }
  t0 = std::chrono::steady_clock::now();
  const std::string decoded = tok->decode(ids);
  double s = seconds_since(t0);
  std::printf("decode: %.2f M tokens/s (round trip %s)\n", ids.size() / s / 1e6,
              decoded == text ? "exact" : "differs (NFC)");
  t0 = std::chrono::steady_clock::now();
  StreamingDecoder stream(tok, false);
  size_t bytes = 0;
  for (int32_t id : ids) bytes += stream.push(id).size();
  bytes += stream.flush().size();
  s = seconds_since(t0);
  std::printf("streaming decode: %.2f M tokens/s (%zu bytes)\n", ids.size() / s / 1e6, bytes);
  return 0;
}

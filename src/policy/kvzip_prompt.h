#pragma once
// KVzip's reconstruction prompt (Kim et al. 2025; the reference implementation's text, no chat
// template): after the context the model reads kKVzipRepeatPrompt, then kKVzipPromptSuffix, then
// the context again, and each context entry is scored by the largest attention it receives
// (`kvzip` policy; eval/kvzip_scorer.h). Chunked reconstructions read this prompt before every
// chunk, placed right after the chunk (backend/cpu/cpu_reconstruction.cpp).
namespace origami {

inline constexpr const char* kKVzipRepeatPrompt = "\n\nRepeat the previous context exactly.";
inline constexpr const char* kKVzipPromptSuffix = "\n";
// Leading entries scored 1 (always kept), and kept in every later chunk's reconstruction.
inline constexpr int kKVzipSinks = 4;

}  // namespace origami

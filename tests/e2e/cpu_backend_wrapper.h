#pragma once
// A Backend that forwards everything to a CPU backend: engine tests derive from it to watch or
// alter one part of the step (execute(), the compressor) and keep the rest real.
#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"

namespace origami::testing {

class CpuBackendWrapper : public Backend {
 public:
  explicit CpuBackendWrapper(std::string name) : name_(std::move(name)) {
    BackendOptions o;
    o.device = "cpu";
    inner_ = std::make_unique<CpuBackend>(o);
  }
  std::string name() const override { return name_; }
  Status load(const ModelConfig& c, const ModelWeights& w) override { return inner_->load(c, w); }
  size_t available_kv_bytes(size_t requested) const override { return inner_->available_kv_bytes(requested); }
  Status allocate_kv_cache(const KVLayout& layout) override { return inner_->allocate_kv_cache(layout); }
  Status execute(const ForwardBatch& batch, StepOutput* out) override { return inner_->execute(batch, out); }
  void copy_block(int group, BlockId src, BlockId dst) override { inner_->copy_block(group, src, dst); }
  Status configure_compression(const CompressionConfig& c) override { return inner_->configure_compression(c); }
  size_t query_slot_bytes(int w) const override { return inner_->query_slot_bytes(w); }
  KVCompressor* compressor() override { return inner_->compressor(); }
  Status load_gates(const gates::GateWeights& g) override { return inner_->load_gates(g); }
  bool runs_reconstruction() const override { return inner_->runs_reconstruction(); }
  bool selects_jointly() const override { return inner_->selects_jointly(); }

 protected:
  std::unique_ptr<CpuBackend> inner_;

 private:
  std::string name_;
};

}  // namespace origami::testing

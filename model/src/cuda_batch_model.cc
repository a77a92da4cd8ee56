// CudaLlama as a BatchEngine's model (polykv/model/cuda_llama.h NewCudaBatchModel): one
// CudaBatch whose slots are the sessions' caches.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "polykv/model/batch_engine.h"
#include "polykv/model/cuda_llama.h"

namespace polykv::model {
namespace {

/// A session's slot of the batch, closed when the session's cache goes.
class SlotCache final : public BatchCache {
 public:
  SlotCache(CudaBatch* batch, int32_t slot) : batch_(batch), slot_(slot) {}
  ~SlotCache() override { batch_->Close(slot_); }
  int32_t slot() const { return slot_; }

 private:
  CudaBatch* batch_;
  int32_t slot_;
};

class CudaBatchModel final : public BatchModel {
 public:
  CudaBatchModel(CudaLlama& model, std::shared_ptr<const KvPrefix> prefix,
                 std::unique_ptr<CudaBatch> batch)
      : model_(model), prefix_(std::move(prefix)), batch_(std::move(batch)) {}

  const ModelConfig& config() const override { return model_.config(); }
  const Tokenizer* tokenizer() const override { return model_.tokenizer(); }
  uint64_t WeightBytesPerStep() const override { return model_.weight_bytes(); }
  int64_t prefix_tokens() const override { return prefix_ ? prefix_->tokens() : 0; }

  StatusOr<std::unique_ptr<BatchCache>> NewCache(int64_t capacity) override {
    if (capacity > batch_->capacity())
      return absl::OutOfRangeError(absl::StrCat("a session of ", capacity,
                                                " own positions; the CUDA batch holds ",
                                                batch_->capacity(), " per session"));
    POLYKV_ASSIGN_OR_RETURN(int32_t slot, batch_->Open());
    return std::unique_ptr<BatchCache>(new SlotCache(batch_.get(), slot));
  }

  StatusOr<BatchLogits> ForwardPrompts(absl::Span<BatchCache* const> caches,
                                       absl::Span<const absl::Span<const int32_t>> prompts,
                                       absl::Span<const uint8_t> need_logits, bool) override {
    if (caches.size() != prompts.size() || caches.size() != need_logits.size())
      return absl::InvalidArgumentError("CUDA batch model: caches, prompts and need_logits differ");
    BatchLogits out = Empty(need_logits);
    std::vector<float> row;
    for (size_t i = 0; i < caches.size(); ++i) {
      POLYKV_RETURN_IF_ERROR(batch_->Prompt(SlotOf(caches[i]), prompts[i],
                                            need_logits[i] ? &row : nullptr, &out.argmax[i]));
      if (need_logits[i])
        std::copy(row.begin(), row.end(), out.logits.values.begin() + i * out.logits.vocab);
    }
    return out;
  }

  StatusOr<BatchLogits> ForwardBatch(absl::Span<BatchCache* const> caches,
                                     absl::Span<const int32_t> tokens,
                                     absl::Span<const uint8_t> need_logits) override {
    if (caches.size() != tokens.size() || caches.size() != need_logits.size())
      return absl::InvalidArgumentError("CUDA batch model: caches, tokens and need_logits differ");
    std::vector<int32_t> slots;
    for (BatchCache* c : caches) slots.push_back(SlotOf(c));
    BatchLogits out = Empty(need_logits);
    POLYKV_RETURN_IF_ERROR(
        batch_->Decode(slots, tokens, need_logits, &out.argmax, &out.logits.values));
    return out;
  }

 private:
  static int32_t SlotOf(BatchCache* c) { return static_cast<SlotCache*>(c)->slot(); }
  // Rows x vocab logits (zeros) only when some row needs them: a greedy step of 256 rows
  // would otherwise clear 48 MiB on the host for nothing.
  BatchLogits Empty(absl::Span<const uint8_t> need_logits) const {
    BatchLogits b;
    const int64_t rows = static_cast<int64_t>(need_logits.size());
    b.logits.rows = rows;
    b.logits.vocab = model_.config().vocab;
    bool any = false;
    for (uint8_t n : need_logits) any = any || n != 0;
    if (any) b.logits.values.assign(static_cast<size_t>(rows * b.logits.vocab), 0.0f);
    b.argmax.assign(static_cast<size_t>(rows), -1);
    return b;
  }

  CudaLlama& model_;
  std::shared_ptr<const KvPrefix> prefix_;
  std::unique_ptr<CudaBatch> batch_;  // after prefix_: freed before it
};

}  // namespace

StatusOr<std::unique_ptr<BatchModel>> NewCudaBatchModel(CudaLlama& model,
                                                        std::shared_ptr<const KvPrefix> prefix,
                                                        int32_t slots, int64_t capacity) {
  POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<CudaBatch> batch,
                          model.NewBatch(prefix.get(), slots, capacity));
  return std::unique_ptr<BatchModel>(
      new CudaBatchModel(model, std::move(prefix), std::move(batch)));
}

}  // namespace polykv::model

// BatchEngine: many generation sessions over ONE shared prefix (a pool's document) in one
// process, decoded together (continuous batching): sessions join and leave between steps;
// each step feeds the newly admitted sessions' prompts together (BatchModel::ForwardPrompts;
// on the CPU LlamaModel::ForwardPrompts: the weights read once for all their rows), then one
// BatchModel::ForwardBatch for every running session (on the CPU LlamaModel::ForwardBatch:
// weights read once per step for all of them, the prefix read once per step by
// kernels::AttentionForwardBatch).
//
// Each session has its own prompt, sampling options (greedy or temperature + top-p with its
// own seed), token budget, stop strings and end-of-generation handling, and its own private
// KV suffix. A session's tokens follow LlamaModel::Generate's rule exactly (the same sampler,
// the same seed stream, EOS neither returned nor cached), so a session alone computes what a
// single agent computes; in a batch its logits differ from that only as ForwardBatch states.
//
// The engine computes on a BatchModel (NewLlamaBatchModel: the CPU runtime); a runtime that
// picks greedy tokens itself returns them in BatchLogits::argmax.
//
// Threads: Submit and Cancel may be called from any thread; Step / RunUntilStopped run on one
// engine thread, which also invokes the sessions' callbacks and every BatchModel call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "polykv/model/llama.h"
#include "polykv/status.h"

namespace polykv::model {

/// One session's private KV cache inside a BatchModel (its memory is freed when destroyed,
/// always before the model).
class BatchCache {
 public:
  virtual ~BatchCache() = default;
};

/// Rows of a BatchModel forward: row i belongs to session i of the call.
struct BatchLogits {
  /// f32 [rows][vocab]. A row whose need_logits entry was false may be left unfilled (zeros)
  /// by a model that fills `argmax`; when no row needs logits, `values` may be empty.
  Logits logits;
  /// Each row's greedy id by the model's own greedy rule (lowest id on ties; model::Argmax on
  /// the CPU, kernels::DeviceArgmaxRows on CUDA, which alone counts a NaN logit as largest),
  /// or empty when the model only returns logits (then every logits row is filled).
  std::vector<int32_t> argmax;
};

/// What a BatchEngine computes on: private caches after ONE shared prefix, prompt forwards
/// and batched decode steps. Called from the engine thread only.
class BatchModel {
 public:
  virtual ~BatchModel() = default;
  virtual const ModelConfig& config() const = 0;
  /// nullptr when the model ships no tokenizer.
  virtual const Tokenizer* tokenizer() const = 0;
  /// Weight bytes read per batched step (for the stats).
  virtual uint64_t WeightBytesPerStep() const = 0;
  /// Tokens of the shared prefix (0: none).
  virtual int64_t prefix_tokens() const = 0;
  /// A private cache after the prefix with room for `capacity` own positions. Errors: the
  /// runtime's (e.g. LlamaModel::NewCacheWithPrefix's).
  [[nodiscard]] virtual StatusOr<std::unique_ptr<BatchCache>> NewCache(int64_t capacity) = 0;
  /// Feeds prompts[i] (non-empty) into caches[i] (made by this model's NewCache) after what it
  /// holds; row i of the result = the logits of session i's LAST prompt row, S =
  /// caches.size() rows. need_logits[i] == 0: session i only needs BatchLogits::argmax.
  /// `joined`: all prompts may run as one forward (LlamaModel::ForwardPrompts); false: one
  /// forward per session (the engine's max_prompt_rows == 0 baseline). Errors:
  /// kInvalidArgument when the spans' sizes differ, and the runtime's; the engine then ends
  /// every session of the call (what their caches hold no longer matters).
  [[nodiscard]] virtual StatusOr<BatchLogits> ForwardPrompts(
      absl::Span<BatchCache* const> caches, absl::Span<const absl::Span<const int32_t>> prompts,
      absl::Span<const uint8_t> need_logits, bool joined) = 0;
  /// One decode step: tokens[i] at the next position of caches[i]; row i = session i's
  /// next-token logits. Errors as ForwardPrompts.
  [[nodiscard]] virtual StatusOr<BatchLogits> ForwardBatch(
      absl::Span<BatchCache* const> caches, absl::Span<const int32_t> tokens,
      absl::Span<const uint8_t> need_logits) = 0;
};

/// The CPU runtime as a BatchModel: caches by LlamaModel::NewCacheWithPrefix(prefix,
/// prefix_tokens, ...) (LlamaModel::NewCache when `prefix` is null: sessions start at
/// position 0), prompts by LlamaModel::ForwardPrompts (joined) or one
/// LlamaModel::Forward(prompt, cache, false) per session, steps by LlamaModel::ForwardBatch;
/// every logits row filled, argmax left empty. `model` must outlive it.
std::unique_ptr<BatchModel> NewLlamaBatchModel(LlamaModel& model,
                                               std::shared_ptr<const KvPrefix> prefix,
                                               std::vector<int32_t> prefix_tokens);

/// Why a session ended.
enum class FinishReason : uint8_t {
  kNone = 0,       ///< still running
  kLength = 1,     ///< max_new_tokens reached
  kStop = 2,       ///< a stop string or an end-of-generation token
  kCancelled = 3,  ///< Cancel() or the callback returned false (e.g. the client went away)
  kError = 4,      ///< the step failed (SessionEvent::error)
};

/// "length", "stop", "cancelled", "error" (OpenAI's finish_reason words for the first two).
const char* FinishReasonName(FinishReason r);

/// What a session asks for.
struct SessionRequest {
  std::vector<int32_t> prompt;  ///< fed after the prefix (>= 1 id)
  /// max_new_tokens, greedy / temperature / top_p / seed, stop_at_eos (Generate's meaning).
  SamplingOptions sampling;
  /// The answer ends before the first occurrence of any of these (needs a tokenizer); the
  /// stop string itself is not returned.
  std::vector<std::string> stop;
};

/// Progress of a session, delivered to its callback on the engine thread.
struct SessionEvent {
  uint64_t id = 0;
  std::vector<int32_t> new_ids;  ///< ids added since the last event
  std::string text_delta;        ///< text added since the last event (UTF-8 complete)
  bool done = false;
  FinishReason finish = FinishReason::kNone;  ///< set when done
  Status error;                               ///< kError: why
  int64_t prompt_tokens = 0;                  ///< the session's own prompt
  int64_t cached_tokens = 0;                  ///< the shared prefix's positions
  int64_t completion_tokens = 0;              ///< tokens generated so far
};

/// Receives a session's events; returning false cancels the session (no further event).
using SessionCallback = std::function<bool(const SessionEvent&)>;

/// Limits of a BatchEngine.
struct BatchEngineOptions {
  int32_t max_sessions = 64;  ///< running at once; more wait in the queue
  /// Context positions allowed per session (prefix + prompt + answer); 0 = the model's
  /// max_positions.
  int64_t max_context = 0;
  /// RunUntilStopped paces steps to at least this many milliseconds (0: as fast as they
  /// run): for tests and demos that need sessions to outlive a client's reaction.
  int32_t min_step_ms = 0;
  /// Prompt rows of sessions admitted in one step that run as ONE joined
  /// BatchModel::ForwardPrompts (sessions taken in queue order while their prompts fit; a
  /// longer prompt runs alone). It bounds that forward's workspace (~26 KiB per row for
  /// SmolLM2-135M on the CPU). 0: one session per ForwardPrompts, not joined (one Forward per
  /// session: the engine before ForwardPrompts; a baseline for benchmarks).
  int64_t max_prompt_rows = 1024;
};

/// Counters of a BatchEngine (for /metrics).
struct BatchEngineStats {
  uint64_t sessions_submitted = 0;
  uint64_t sessions_finished = 0;
  uint64_t sessions_cancelled = 0;
  uint64_t steps = 0;                  ///< batched decode steps
  uint64_t step_rows = 0;              ///< sum over steps of the sessions in each
  uint64_t prompt_tokens = 0;          ///< prompt tokens fed
  uint64_t generated_tokens = 0;       ///< tokens sampled
  double decode_seconds = 0;           ///< time inside ForwardBatch
  double prefill_seconds = 0;          ///< time inside prompt forwards
  uint64_t prompt_forwards = 0;        ///< prompt forwards run (several sessions' each)
  int64_t running = 0;                 ///< sessions decoding now
  int64_t waiting = 0;                 ///< sessions queued
  uint64_t weight_bytes_per_step = 0;  ///< weights read per batched step (once for all)
  uint64_t prefix_bytes_per_step = 0;  ///< prefix read per batched step (once for all)
};

/// Sessions over one shared prefix, decoded in batches (see the file comment).
class BatchEngine {
 public:
  /// Computes on `model` (non-null; the engine owns it). `prefix_bytes` is the prefix's bytes
  /// per step (KvPrefix view LayerBytes x layers), for the stats only.
  BatchEngine(std::unique_ptr<BatchModel> model, uint64_t prefix_bytes,
              BatchEngineOptions options = {});
  /// On the CPU runtime: NewLlamaBatchModel(model, prefix, prefix_tokens); `model` must
  /// outlive the engine.
  BatchEngine(LlamaModel& model, std::shared_ptr<const KvPrefix> prefix,
              std::vector<int32_t> prefix_tokens, uint64_t prefix_bytes,
              BatchEngineOptions options = {});
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  /// Queues a session; returns its id (> 0). Thread-safe. Errors: kInvalidArgument for an
  /// empty prompt, ids outside the vocabulary, max_new_tokens < 0, temperature <= 0 or top_p
  /// outside (0, 1] when sampling, stop strings without a tokenizer; kOutOfRange when prefix
  /// + prompt + max_new_tokens exceeds the context; kFailedPrecondition after Shutdown.
  [[nodiscard]] StatusOr<uint64_t> Submit(SessionRequest request, SessionCallback callback);

  /// Ends a session before its next step (its callback sees nothing more); its KV is freed
  /// then. Thread-safe; unknown ids are ignored.
  void Cancel(uint64_t id);

  /// One scheduling step on the calling thread: drops cancelled sessions, admits queued ones
  /// (their prompts' forwards, BatchEngineOptions::max_prompt_rows, + first token each), then one
  /// batched decode step for all running sessions. Returns whether anything ran. A failing forward
  /// ends the sessions it covered with FinishReason::kError (their callbacks get the status); the
  /// engine goes on.
  bool Step();

  /// Runs Step until Shutdown, sleeping while there is no session. Blocks.
  void RunUntilStopped();

  /// Stops RunUntilStopped and refuses new sessions; queued and running sessions end with
  /// kCancelled. Thread-safe.
  void Shutdown();

  BatchEngineStats stats() const;
  /// What the engine computes on (its config and tokenizer).
  const BatchModel& model() const { return *model_; }
  /// Tokens of the shared prefix (BatchModel::prefix_tokens).
  int64_t prefix_tokens() const { return model_->prefix_tokens(); }

 private:
  struct Session;
  void Admit(std::vector<std::unique_ptr<Session>>& fresh);
  void DecodeRunning();
  /// Takes the token of `row` of `out` (its argmax for a greedy session when the model gave
  /// one, else SampleToken on its logits), records it, emits an event; false when the session
  /// ended.
  bool Advance(Session& s, const BatchLogits& out, int64_t row);
  void Finish(Session& s, FinishReason why, Status error = absl::OkStatus());
  void Emit(Session& s, bool done, FinishReason why = FinishReason::kNone,
            Status error = absl::OkStatus());

  std::unique_ptr<BatchModel> model_;  // first: outlives every session's BatchCache
  uint64_t prefix_bytes_;
  BatchEngineOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Session>> queue_;  // guarded by mu_
  std::vector<uint64_t> cancelled_;              // guarded by mu_
  bool stopped_ = false;                         // guarded by mu_
  uint64_t next_id_ = 1;                         // guarded by mu_
  BatchEngineStats stats_;                       // guarded by mu_

  std::vector<std::unique_ptr<Session>> running_;  // engine thread only
};

}  // namespace polykv::model

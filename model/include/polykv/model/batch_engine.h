// BatchEngine: many generation sessions over ONE shared prefix (a pool's document) in one
// process, decoded together (continuous batching): sessions join and leave between steps;
// each step feeds the newly admitted sessions' prompts together (LlamaModel::ForwardPrompts:
// the weights read once for all their rows), then one LlamaModel::ForwardBatch for every
// running session (weights read once per step for all of
// them, the prefix read once per step by kernels::AttentionForwardBatch).
//
// Each session has its own prompt, sampling options (greedy or temperature + top-p with its
// own seed), token budget, stop strings and end-of-generation handling, and its own private
// KV suffix. A session's tokens follow LlamaModel::Generate's rule exactly (the same sampler,
// the same seed stream, EOS neither returned nor cached), so a session alone computes what a
// single agent computes; in a batch its logits differ from that only as ForwardBatch states.
//
// Threads: Submit and Cancel may be called from any thread; Step / RunUntilStopped run on one
// engine thread, which also invokes the sessions' callbacks.
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
  /// Prompt rows of sessions admitted in one step that run as ONE LlamaModel::ForwardPrompts
  /// (sessions taken in queue order while their prompts fit; a longer prompt runs alone).
  /// It bounds that forward's workspace (~26 KiB per row for SmolLM2-135M). 0: one Forward
  /// per session (the engine before ForwardPrompts; a baseline for benchmarks).
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
  /// `model` must outlive the engine. `prefix` may be null (sessions start from position 0),
  /// else caches are made with LlamaModel::NewCacheWithPrefix(prefix, prefix_tokens, ...).
  /// `prefix_bytes` is the prefix's bytes per step (KvPrefix view LayerBytes x layers), for
  /// the stats only.
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
  const LlamaModel& model() const { return model_; }
  int64_t prefix_tokens() const { return static_cast<int64_t>(prefix_tokens_.size()); }

 private:
  struct Session;
  void Admit(std::vector<std::unique_ptr<Session>>& fresh);
  void DecodeRunning();
  /// Samples from `logits`, records the token, emits an event; false when the session ended.
  bool Advance(Session& s, absl::Span<const float> logits);
  void Finish(Session& s, FinishReason why, Status error = absl::OkStatus());
  void Emit(Session& s, bool done, FinishReason why = FinishReason::kNone,
            Status error = absl::OkStatus());

  LlamaModel& model_;
  std::shared_ptr<const KvPrefix> prefix_;
  std::vector<int32_t> prefix_tokens_;
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

// BatchEngine: continuous batching of generation sessions over one shared prefix.
#include "polykv/model/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "llama_internal.h"
#include "polykv/enum_names.h"

namespace polykv::model {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Bytes at the end of `text` that start an incomplete UTF-8 sequence (held back in a stream).
size_t IncompleteUtf8Tail(const std::string& text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    if ((c & 0xF0) == 0xE0) need = 3;
    if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

// The CPU runtime's cache: a KvCache.
struct LlamaBatchCache : BatchCache {
  KvCache kv;
};

class LlamaBatchModel : public BatchModel {
 public:
  LlamaBatchModel(LlamaModel& model, std::shared_ptr<const KvPrefix> prefix,
                  std::vector<int32_t> prefix_tokens)
      : model_(model), prefix_(std::move(prefix)), prefix_tokens_(std::move(prefix_tokens)) {}

  const ModelConfig& config() const override { return model_.config(); }
  const Tokenizer* tokenizer() const override { return model_.tokenizer(); }
  uint64_t WeightBytesPerStep() const override {
    return static_cast<uint64_t>(model_.WeightBytesPerToken());
  }
  int64_t prefix_tokens() const override { return static_cast<int64_t>(prefix_tokens_.size()); }

  StatusOr<std::unique_ptr<BatchCache>> NewCache(int64_t capacity) override {
    auto c = std::make_unique<LlamaBatchCache>();
    if (prefix_) {
      POLYKV_ASSIGN_OR_RETURN(c->kv, model_.NewCacheWithPrefix(prefix_, prefix_tokens_, capacity));
    } else {
      c->kv = model_.NewCache(capacity);
    }
    return std::unique_ptr<BatchCache>(std::move(c));
  }

  StatusOr<BatchLogits> ForwardPrompts(absl::Span<BatchCache* const> caches,
                                       absl::Span<const absl::Span<const int32_t>> prompts,
                                       absl::Span<const uint8_t> need_logits,
                                       bool joined) override {
    POLYKV_ASSIGN_OR_RETURN(std::vector<KvCache*> kv, Unwrap(caches, need_logits));
    BatchLogits out;
    // Not joined: LlamaModel's own default, one Forward(prompts[i], cache, false) per session.
    POLYKV_ASSIGN_OR_RETURN(out.logits, joined ? model_.ForwardPrompts(kv, prompts)
                                               : model_.LlamaModel::ForwardPrompts(kv, prompts));
    return out;
  }

  StatusOr<BatchLogits> ForwardBatch(absl::Span<BatchCache* const> caches,
                                     absl::Span<const int32_t> tokens,
                                     absl::Span<const uint8_t> need_logits) override {
    POLYKV_ASSIGN_OR_RETURN(std::vector<KvCache*> kv, Unwrap(caches, need_logits));
    BatchLogits out;
    POLYKV_ASSIGN_OR_RETURN(out.logits, model_.ForwardBatch(kv, tokens));
    return out;
  }

 private:
  // The KvCaches behind `caches` (made by NewCache; null stays null for LlamaModel's checks).
  static StatusOr<std::vector<KvCache*>> Unwrap(absl::Span<BatchCache* const> caches,
                                                absl::Span<const uint8_t> need_logits) {
    if (need_logits.size() != caches.size())
      return absl::InvalidArgumentError(
          absl::StrCat(caches.size(), " caches but ", need_logits.size(), " need_logits flags"));
    std::vector<KvCache*> kv;
    for (BatchCache* c : caches)
      kv.push_back(c != nullptr ? &static_cast<LlamaBatchCache*>(c)->kv : nullptr);
    return kv;
  }

  LlamaModel& model_;
  std::shared_ptr<const KvPrefix> prefix_;
  std::vector<int32_t> prefix_tokens_;
};

// A BatchModel forward's result, checked before the engine indexes it: `out` when it is an
// error or fits one row per need_logits entry of `vocab` ids (logits may be absent when every
// row takes the model's argmax); kInternal otherwise.
StatusOr<BatchLogits> CheckRows(StatusOr<BatchLogits> out, absl::Span<const uint8_t> need_logits,
                                int32_t vocab) {
  if (!out.ok()) return out;
  const size_t rows = need_logits.size();
  const bool any_logits =
      std::any_of(need_logits.begin(), need_logits.end(), [](uint8_t n) { return n != 0; });
  const Logits& l = out->logits;
  bool ok = l.rows == static_cast<int64_t>(rows) && l.vocab == vocab &&
            (l.values.size() == rows * static_cast<size_t>(vocab) ||
             (l.values.empty() && !out->argmax.empty() && !any_logits)) &&
            (out->argmax.empty() || out->argmax.size() == rows);
  for (int32_t id : out->argmax) ok = ok && id >= 0 && id < vocab;
  if (ok) return out;
  return absl::InternalError(absl::StrCat("the batch model returned ", l.rows, " x ", l.vocab,
                                          " logits and ", out->argmax.size(), " argmax ids for ",
                                          rows, " sessions of a ", vocab, "-id vocabulary"));
}

}  // namespace

std::unique_ptr<BatchModel> NewLlamaBatchModel(LlamaModel& model,
                                               std::shared_ptr<const KvPrefix> prefix,
                                               std::vector<int32_t> prefix_tokens) {
  return std::make_unique<LlamaBatchModel>(model, std::move(prefix), std::move(prefix_tokens));
}

const char* FinishReasonName(FinishReason r) {
  static constexpr EnumName<FinishReason> kNames[] = {
      {FinishReason::kNone, "none"},   {FinishReason::kLength, "length"},
      {FinishReason::kStop, "stop"},   {FinishReason::kCancelled, "cancelled"},
      {FinishReason::kError, "error"},
  };
  return EnumToName(kNames, r);
}

struct BatchEngine::Session {
  uint64_t id = 0;
  SessionRequest req;
  SessionCallback callback;
  std::unique_ptr<BatchCache> cache;
  std::mt19937_64 rng;
  std::vector<int32_t> answer;
  std::string text;  // the answer decoded (truncated at a stop string)
  size_t emitted_ids = 0, emitted_chars = 0, max_stop = 0;
  int32_t next = -1;  // token fed in the next batched step
  bool finished = false;
  bool silent = false;  // cancelled: no more events
};

BatchEngine::BatchEngine(std::unique_ptr<BatchModel> model, uint64_t prefix_bytes,
                         BatchEngineOptions options)
    : model_(std::move(model)), prefix_bytes_(prefix_bytes), options_(options) {
  POLYKV_CHECK(model_ != nullptr);
  stats_.weight_bytes_per_step = model_->WeightBytesPerStep();
  stats_.prefix_bytes_per_step = prefix_bytes_;
}

BatchEngine::BatchEngine(LlamaModel& model, std::shared_ptr<const KvPrefix> prefix,
                         std::vector<int32_t> prefix_tokens, uint64_t prefix_bytes,
                         BatchEngineOptions options)
    : BatchEngine(NewLlamaBatchModel(model, std::move(prefix), std::move(prefix_tokens)),
                  prefix_bytes, options) {}

BatchEngine::~BatchEngine() {
  Shutdown();
  // Sessions still held end silently: no callback may run after the engine is gone.
  running_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
}

StatusOr<uint64_t> BatchEngine::Submit(SessionRequest request, SessionCallback callback) {
  const ModelConfig& cfg = model_->config();
  const SamplingOptions& o = request.sampling;
  if (request.prompt.empty())
    return absl::InvalidArgumentError("empty prompt: give at least one token");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= cfg.vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " is outside the vocabulary [0, ", cfg.vocab, ")"));
  POLYKV_RETURN_IF_ERROR(internal::CheckSamplingOptions(o, ""));
  size_t max_stop = 0;
  for (const std::string& s : request.stop) {
    if (s.empty()) return absl::InvalidArgumentError("empty stop string");
    max_stop = std::max(max_stop, s.size());
  }
  if (max_stop > 0 && model_->tokenizer() == nullptr)
    return absl::InvalidArgumentError("stop strings need a model with a tokenizer");
  const int64_t context = options_.max_context > 0 ? options_.max_context : cfg.max_positions;
  const int64_t need = prefix_tokens() + static_cast<int64_t>(request.prompt.size()) +
                       std::max<int32_t>(o.max_new_tokens, 0);
  if (context > 0 && need > context)
    return absl::OutOfRangeError(absl::StrCat(
        "prefix (", prefix_tokens(), ") + prompt (", request.prompt.size(), ") + max tokens (",
        o.max_new_tokens, ") = ", need, " positions exceed the context of ", context));
  auto s = std::make_unique<Session>();
  s->req = std::move(request);
  s->callback = std::move(callback);
  s->rng.seed(s->req.sampling.seed);
  s->max_stop = max_stop;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return absl::FailedPreconditionError("the engine is shutting down");
  s->id = next_id_++;
  const uint64_t id = s->id;
  queue_.push_back(std::move(s));
  ++stats_.sessions_submitted;
  stats_.waiting = static_cast<int64_t>(queue_.size());
  cv_.notify_all();
  return id;
}

void BatchEngine::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.push_back(id);
  cv_.notify_all();
}

void BatchEngine::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

BatchEngineStats BatchEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void BatchEngine::Emit(Session& s, bool done, FinishReason why, Status error) {
  if (s.silent) return;
  SessionEvent e;
  e.id = s.id;
  e.new_ids.assign(s.answer.begin() + static_cast<std::ptrdiff_t>(s.emitted_ids), s.answer.end());
  s.emitted_ids = s.answer.size();
  size_t safe = s.text.size();
  if (!done) {
    // Hold back what could still become a stop string, and an incomplete UTF-8 sequence.
    safe -= std::min(safe, s.max_stop > 0 ? s.max_stop - 1 : 0);
    while (safe > 0 && safe < s.text.size() &&
           (static_cast<unsigned char>(s.text[safe]) & 0xC0) == 0x80)
      --safe;
    if (safe == s.text.size()) safe -= IncompleteUtf8Tail(s.text);
  }
  if (safe > s.emitted_chars) {
    e.text_delta = s.text.substr(s.emitted_chars, safe - s.emitted_chars);
    s.emitted_chars = safe;
  }
  e.done = done;
  e.finish = why;
  e.error = std::move(error);
  e.prompt_tokens = static_cast<int64_t>(s.req.prompt.size());
  e.cached_tokens = prefix_tokens();
  e.completion_tokens = static_cast<int64_t>(s.answer.size());
  if (done || !e.new_ids.empty() || !e.text_delta.empty()) {
    if (!s.callback(e) && !done) {
      s.silent = true;
      s.finished = true;
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.sessions_cancelled;
    }
  }
}

void BatchEngine::Finish(Session& s, FinishReason why, Status error) {
  if (s.finished) return;
  s.finished = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++(why == FinishReason::kCancelled ? stats_.sessions_cancelled : stats_.sessions_finished);
  }
  Emit(s, true, why, std::move(error));
  s.silent = true;
  s.cache.reset();  // free the private KV now
}

bool BatchEngine::Advance(Session& s, const BatchLogits& out, int64_t row) {
  StatusOr<int32_t> tok = !out.argmax.empty() && s.req.sampling.greedy
                              ? out.argmax[static_cast<size_t>(row)]
                              : SampleToken(out.logits.row(row), s.req.sampling, s.rng);
  if (!tok.ok()) {
    Finish(s, FinishReason::kError, tok.status());
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.generated_tokens;
  }
  const Tokenizer* t = model_->tokenizer();
  const bool eos = t != nullptr ? t->IsEndOfGeneration(*tok) : *tok == model_->config().eos_id;
  if (s.req.sampling.stop_at_eos && eos) {
    Finish(s, FinishReason::kStop);
    return false;
  }
  s.answer.push_back(*tok);
  if (t != nullptr) {
    StatusOr<std::string> text = t->Decode(s.answer);
    if (text.ok()) s.text = std::move(*text);
    size_t cut = std::string::npos;
    for (const std::string& stop : s.req.stop) {
      const size_t from = s.emitted_chars > stop.size() ? s.emitted_chars - stop.size() : 0;
      cut = std::min(cut, s.text.find(stop, from));
    }
    if (cut != std::string::npos) {
      s.text.resize(std::max(cut, s.emitted_chars));
      Finish(s, FinishReason::kStop);
      return false;
    }
  }
  if (static_cast<int64_t>(s.answer.size()) >= s.req.sampling.max_new_tokens) {
    Finish(s, FinishReason::kLength);
    return false;
  }
  s.next = *tok;
  Emit(s, false);
  return !s.finished;
}

void BatchEngine::Admit(std::vector<std::unique_ptr<Session>>& fresh) {
  // Every joining session's cache first; then their prompts in groups of at most
  // max_prompt_rows rows, each group one joined ForwardPrompts (one session per call, not
  // joined, when 0).
  std::vector<Session*> ready;
  for (std::unique_ptr<Session>& s : fresh) {
    const int64_t capacity = static_cast<int64_t>(s->req.prompt.size()) +
                             std::max<int32_t>(s->req.sampling.max_new_tokens, 0) + 1;
    StatusOr<std::unique_ptr<BatchCache>> c = model_->NewCache(capacity);
    if (!c.ok()) {
      Finish(*s, FinishReason::kError, c.status());
      continue;
    }
    s->cache = std::move(*c);
    ready.push_back(s.get());
  }
  for (size_t begin = 0; begin < ready.size();) {
    size_t end = begin + 1;
    int64_t rows = static_cast<int64_t>(ready[begin]->req.prompt.size());
    while (options_.max_prompt_rows > 0 && end < ready.size() &&
           rows + static_cast<int64_t>(ready[end]->req.prompt.size()) <= options_.max_prompt_rows)
      rows += static_cast<int64_t>(ready[end++]->req.prompt.size());
    const absl::Span<Session* const> group = absl::MakeConstSpan(ready).subspan(begin, end - begin);
    begin = end;
    const auto t0 = Clock::now();
    std::vector<BatchCache*> caches;
    std::vector<absl::Span<const int32_t>> prompts;
    std::vector<uint8_t> need_logits;  // a greedy session needs only the model's argmax
    for (Session* s : group) {
      caches.push_back(s->cache.get());
      prompts.push_back(s->req.prompt);
      need_logits.push_back(s->req.sampling.greedy ? 0 : 1);
    }
    StatusOr<BatchLogits> logits =
        model_->ForwardPrompts(caches, prompts, need_logits, options_.max_prompt_rows > 0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prefill_seconds += SecondsSince(t0);
      stats_.prompt_tokens += static_cast<uint64_t>(rows);
      ++stats_.prompt_forwards;
    }
    logits = CheckRows(std::move(logits), need_logits, model_->config().vocab);
    for (size_t i = 0; i < group.size(); ++i) {
      Session& s = *group[i];
      if (!logits.ok()) {
        Finish(s, FinishReason::kError, logits.status());
      } else if (s.req.sampling.max_new_tokens == 0) {
        Finish(s, FinishReason::kLength);
      } else {
        Advance(s, *logits, static_cast<int64_t>(i));
      }
    }
  }
  for (std::unique_ptr<Session>& s : fresh)
    if (!s->finished) running_.push_back(std::move(s));
}

void BatchEngine::DecodeRunning() {
  std::vector<BatchCache*> caches;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> need_logits;  // as in Admit
  for (const std::unique_ptr<Session>& s : running_) {
    caches.push_back(s->cache.get());
    tokens.push_back(s->next);
    need_logits.push_back(s->req.sampling.greedy ? 0 : 1);
  }
  if (caches.empty()) return;
  const auto t0 = Clock::now();
  StatusOr<BatchLogits> logits = model_->ForwardBatch(caches, tokens, need_logits);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.decode_seconds += SecondsSince(t0);
    ++stats_.steps;
    stats_.step_rows += caches.size();
  }
  logits = CheckRows(std::move(logits), need_logits, model_->config().vocab);
  for (size_t i = 0; i < running_.size(); ++i) {
    if (!logits.ok()) {
      Finish(*running_[i], FinishReason::kError, logits.status());
    } else {
      Advance(*running_[i], *logits, static_cast<int64_t>(i));
    }
  }
}

bool BatchEngine::Step() {
  std::vector<std::unique_ptr<Session>> fresh;
  std::vector<uint64_t> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled.swap(cancelled_);
    const auto is_cancelled = [&](const std::unique_ptr<Session>& s) {
      return std::find(cancelled.begin(), cancelled.end(), s->id) != cancelled.end();
    };
    const size_t before = queue_.size();
    queue_.erase(std::remove_if(queue_.begin(), queue_.end(), is_cancelled), queue_.end());
    stats_.sessions_cancelled += before - queue_.size();
    const size_t room = static_cast<size_t>(
        std::max<int64_t>(0, options_.max_sessions - static_cast<int64_t>(running_.size())));
    const size_t take = std::min(room, queue_.size());
    for (size_t i = 0; i < take; ++i) fresh.push_back(std::move(queue_[i]));
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(take));
    stats_.waiting = static_cast<int64_t>(queue_.size());
  }
  for (std::unique_ptr<Session>& s : running_) {
    if (std::find(cancelled.begin(), cancelled.end(), s->id) != cancelled.end()) {
      s->silent = true;
      Finish(*s, FinishReason::kCancelled);
    }
  }
  const auto drop_finished = [this] {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const std::unique_ptr<Session>& s) { return s->finished; }),
                   running_.end());
  };
  drop_finished();
  const bool any = !fresh.empty() || !running_.empty();
  Admit(fresh);
  DecodeRunning();
  drop_finished();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = static_cast<int64_t>(running_.size());
  return any;
}

void BatchEngine::RunUntilStopped() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopped_ || !queue_.empty() || !running_.empty() || !cancelled_.empty();
      });
      if (stopped_) break;
    }
    const auto t0 = Clock::now();
    Step();
    const auto pace = std::chrono::milliseconds(options_.min_step_ms) - (Clock::now() - t0);
    if (pace.count() > 0) std::this_thread::sleep_for(pace);
  }
  // Shutting down: every session still known ends with kCancelled.
  std::vector<std::unique_ptr<Session>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued.swap(queue_);
  }
  for (std::unique_ptr<Session>& s : running_) Finish(*s, FinishReason::kCancelled);
  for (std::unique_ptr<Session>& s : queued) Finish(*s, FinishReason::kCancelled);
  running_.clear();
}

}  // namespace polykv::model

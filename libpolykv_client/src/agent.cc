// PooledAgent: attach a polykvd pool, attend to it in place (or decode it into a private KV
// cache), generate.
#include "polykv/agent.h"

#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "polykv/client.h"
#include "polykv/ipc/pool_layout.h"

namespace polykv::client {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

StatusOr<polykv_dtype> CDtypeOf(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return POLYKV_DTYPE_F32;
    case torch::kFloat16: return POLYKV_DTYPE_F16;
    case torch::kBFloat16: return POLYKV_DTYPE_BF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("model dtype ", c10::toString(t), " cannot receive a pool decode"));
  }
}

// Detaches on scope exit (also on error paths).
struct PoolGuard {
  polykv_pool* pool = nullptr;
  ~PoolGuard() {
    if (pool != nullptr) polykv_detach(pool);
  }
  Status Release() {
    if (pool == nullptr) return absl::OkStatus();
    polykv_pool* p = pool;
    pool = nullptr;
    polykv_status s = polykv_detach(p);
    if (s != POLYKV_OK) return FromCStatus(s, "detach");
    return absl::OkStatus();
  }
};

bool IsConnectionError(const Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

const char* AttendName(Attend a) { return a == Attend::kInPlace ? "in-place" : "decompressed"; }

StatusOr<Attend> ParseAttend(std::string_view text) {
  if (text == "in-place") return Attend::kInPlace;
  if (text == "decompressed") return Attend::kDecompressed;
  return absl::InvalidArgumentError(
      absl::StrCat("attend mode '", std::string(text), "' (expected in-place or decompressed)"));
}

ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/smaps_rollup");
  std::string line;
  const auto field = [&](const char* key, uint64_t* out) {
    const size_t n = std::strlen(key);
    if (line.compare(0, n, key) == 0) *out += std::strtoull(line.c_str() + n, nullptr, 10) * 1024;
  };
  while (std::getline(in, line)) {
    field("Rss:", &m.rss);
    field("Pss:", &m.pss);
    field("Private_Clean:", &m.private_bytes);
    field("Private_Dirty:", &m.private_bytes);
    field("Anonymous:", &m.anonymous);
  }
  return m;
}

Status FromCStatus(int code, std::string_view context) {
  if (code == POLYKV_OK) return absl::OkStatus();
  const char* detail = polykv_last_error();
  std::string msg = absl::StrCat(std::string(context), ": ", polykv_status_string(static_cast<polykv_status>(code)));
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&msg, ": ", detail);
  return Status(static_cast<absl::StatusCode>(code), msg);
}

uint64_t PeakRssBytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux: kilobytes
}

uint64_t CacheBytes(const model::KvCache& cache) {
  uint64_t bytes = 0;
  for (const auto& t : cache.k) bytes += t.defined() ? t.numel() * t.element_size() : 0;
  for (const auto& t : cache.v) bytes += t.defined() ? t.numel() * t.element_size() : 0;
  return bytes;
}

std::string ChatQuestionPrompt(std::string_view question) {
  return absl::StrCat("<|im_start|>user\n", std::string(question), "<|im_end|>\n<|im_start|>assistant\n");
}

std::string ChatDocument(std::string_view document, std::string_view instruction) {
  return absl::StrCat("<|im_start|>system\n", std::string(instruction), "\n\n", std::string(document), "<|im_end|>\n");
}

Status PooledAgent::AttachPool(const std::string& id, polykv_pool** pool,
                               polykv_pool_info* info) {
  POLYKV_RETURN_IF_ERROR(EnsureConnected(nullptr));
  polykv_status cs = polykv_attach(client_, id.c_str(), pool);
  if (cs != POLYKV_OK) {
    Status s = FromCStatus(cs, absl::StrCat("attach pool ", id));
    if (IsConnectionError(s)) Disconnect();
    return s;
  }
  return FromCStatus(polykv_pool_get_info(*pool, info), "pool info");
}

StatusOr<std::unique_ptr<PooledAgent>> PooledAgent::Create(const AgentOptions& options) {
  std::unique_ptr<PooledAgent> agent(new PooledAgent());
  agent->options_ = options;
  model::LoadOptions load = options.load;
  load.threads = options.threads;
  POLYKV_ASSIGN_OR_RETURN(agent->model_, model::LlamaModel::Load(options.model_path, load));
  model::SetComputeThreads(options.threads);
  return agent;
}

PooledAgent::~PooledAgent() { Disconnect(); }

void PooledAgent::Disconnect() {
  if (client_ != nullptr) {
    polykv_disconnect(client_);
    client_ = nullptr;
  }
}

Status PooledAgent::EnsureConnected(double* connect_ms) {
  if (client_ != nullptr) return absl::OkStatus();
  auto t0 = Clock::now();
  polykv_status s = polykv_connect(options_.endpoint.empty() ? nullptr : options_.endpoint.c_str(),
                                   options_.timeout_ms, &client_);
  if (connect_ms != nullptr) *connect_ms = MsSince(t0);
  if (s != POLYKV_OK) {
    client_ = nullptr;
    return FromCStatus(s, absl::StrCat("cannot reach polykvd at ",
                                       options_.endpoint.empty() ? "the default endpoint"
                                                                 : options_.endpoint));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<int32_t>> PooledAgent::EncodePrompt(std::string_view text) const {
  const model::Tokenizer* tok = model_->tokenizer();
  if (tok == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", options_.model_path,
                     " has no tokenizer: give the prompt as token ids"));
  }
  return tok->Encode(text, /*add_bos=*/false);
}

std::string PooledAgent::DecodeText(absl::Span<const int32_t> ids) const {
  const model::Tokenizer* tok = model_->tokenizer();
  if (tok == nullptr) return "";
  auto text = tok->Decode(ids);
  return text.ok() ? *text : std::string();
}

StatusOr<AgentResult> PooledAgent::RunText(std::string_view pool_id, std::string_view prompt,
                                           const model::SamplingOptions& sampling) {
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, EncodePrompt(prompt));
  return Run(pool_id, ids, sampling);
}

StatusOr<std::vector<int32_t>> PooledAgent::PoolTokenIds(std::string_view pool_id) {
  POLYKV_RETURN_IF_ERROR(EnsureConnected(nullptr));
  std::string id(pool_id);
  PoolGuard guard;
  polykv_status s = polykv_attach(client_, id.c_str(), &guard.pool);
  if (s != POLYKV_OK) {
    Status st = FromCStatus(s, absl::StrCat("attach pool ", id));
    if (IsConnectionError(st)) Disconnect();
    return st;
  }
  polykv_pool_info info{};
  POLYKV_RETURN_IF_ERROR(FromCStatus(polykv_pool_get_info(guard.pool, &info), "pool info"));
  std::vector<int32_t> ids(info.tokens);
  POLYKV_RETURN_IF_ERROR(
      FromCStatus(polykv_pool_token_ids(guard.pool, ids.data(), ids.size()), "pool token ids"));
  POLYKV_RETURN_IF_ERROR(guard.Release());
  return ids;
}

StatusOr<AgentResult> PooledAgent::Run(std::string_view pool_id,
                                       absl::Span<const int32_t> prompt_ids,
                                       const model::SamplingOptions& sampling) {
  if (prompt_ids.empty()) return absl::InvalidArgumentError("empty prompt: give at least one token");
  const model::ModelConfig& cfg = model_->config();
  for (int32_t id : prompt_ids) {
    if (id < 0 || id >= cfg.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " is outside the vocabulary [0, ", cfg.vocab, ")"));
    }
  }
  AgentResult result;
  result.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
  AgentStats& st = result.stats;
  const std::string id(pool_id);

  // ---- attach (connect lazily; a dead connection is rebuilt on the next Run) ----
  auto t_attach = Clock::now();
  PoolGuard guard;
  polykv_pool_info info{};
  POLYKV_RETURN_IF_ERROR(AttachPool(id, &guard.pool, &info));
  st.attach_ms = MsSince(t_attach);

  // ---- the pool must come from this model ----
  if (model_->fingerprint() != info.model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", id, " was prefilled with model ", info.model, " (fingerprint ",
        std::string(info.model_fingerprint).substr(0, 16), "...) but this agent loaded ",
        options_.model_path, " (fingerprint ", model_->fingerprint().substr(0, 16),
        "...): load the pool's model"));
  }
  if (static_cast<int32_t>(info.layers) != cfg.layers ||
      static_cast<int32_t>(info.kv_heads) != cfg.kv_heads ||
      static_cast<int32_t>(info.head_dim) != cfg.head_dim) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", id, " shape layers=", info.layers, " kv_heads=", info.kv_heads,
        " head_dim=", info.head_dim, " does not match the model (", cfg.layers, ", ",
        cfg.kv_heads, ", ", cfg.head_dim, ")"));
  }
  const int64_t tokens = static_cast<int64_t>(info.tokens);
  if (tokens < 1) return absl::FailedPreconditionError(absl::StrCat("pool ", id, " is empty"));
  st.document_tokens = tokens;
  st.prompt_tokens = static_cast<int64_t>(prompt_ids.size());
  st.pool_bytes = info.total_bytes;
  st.pool_bf16_bytes = info.bf16_bytes;
  result.codec = info.codec;

  // ---- the document's KV: a view of the mapped pool, or decoded into a private cache ----
  auto t_decode = Clock::now();
  std::vector<int32_t> doc_ids(tokens);
  POLYKV_RETURN_IF_ERROR(FromCStatus(
      polykv_pool_token_ids(guard.pool, doc_ids.data(), doc_ids.size()), "pool token ids"));
  const bool in_place = options_.attend == Attend::kInPlace &&
                        model_->weight_storage() == model::WeightStorage::kMapped &&
                        std::string(info.backend) == "host";
  result.attend = in_place ? Attend::kInPlace : Attend::kDecompressed;
  const int64_t extra =
      static_cast<int64_t>(prompt_ids.size()) + std::max<int32_t>(sampling.max_new_tokens, 0) + 1;
  model::KvCache cache;
  POLYKV_RETURN_IF_ERROR(
      BuildCache(guard.pool, id, tokens, extra, std::move(doc_ids), in_place, &cache, &st));
  st.decode_ms = MsSince(t_decode);
  st.private_kv_bytes = CacheBytes(cache);

  // ---- generate after the document ----
  POLYKV_ASSIGN_OR_RETURN(model::GenerateResult gen, model_->Generate(cache, prompt_ids, sampling));
  result.answer_ids = std::move(gen.tokens);
  result.answer_text = DecodeText(result.answer_ids);
  st.prompt_first_token_ms = gen.first_token_ms;
  st.ttft_ms = st.attach_ms + st.decode_ms + gen.first_token_ms;
  st.generation_ms = gen.total_ms;
  st.new_tokens = static_cast<int64_t>(result.answer_ids.size());
  st.tokens_per_s = gen.total_ms > 0 ? st.new_tokens * 1000.0 / gen.total_ms : 0;
  st.private_kv_bytes = std::max<uint64_t>(st.private_kv_bytes, CacheBytes(cache));
  st.memory = ReadProcessMemory();
  if (hooks_.before_detach) hooks_.before_detach();
  cache = model::KvCache();  // no view of the pool may outlive the mapping

  // The answer was computed from data checked under a valid lease; a failing DETACH (e.g.
  // the pool was evicted meanwhile, or the daemon left) does not invalidate it.
  (void)guard.Release();
  st.peak_rss_bytes = PeakRssBytes();
  return result;
}

StatusOr<std::vector<double>> PooledAgent::Score(std::string_view pool_id,
                                                 absl::Span<const int32_t> input_ids,
                                                 absl::Span<const int32_t> target_ids,
                                                 int64_t rows) {
  if (input_ids.empty() || input_ids.size() != target_ids.size())
    return absl::InvalidArgumentError(absl::StrCat("score: ", input_ids.size(), " inputs and ",
                                                   target_ids.size(), " targets (need equal, > 0)"));
  const model::ModelConfig& cfg = model_->config();
  for (absl::Span<const int32_t> span : {input_ids, target_ids})
    for (int32_t id : span)
      if (id < 0 || id >= cfg.vocab)
        return absl::InvalidArgumentError(absl::StrCat("score: token id ", id, " outside the vocabulary"));
  const std::string id(pool_id);
  PoolGuard guard;
  polykv_pool_info info{};
  POLYKV_RETURN_IF_ERROR(AttachPool(id, &guard.pool, &info));
  if (model_->fingerprint() != info.model_fingerprint)
    return absl::FailedPreconditionError(absl::StrCat("pool ", id, " was prefilled with another model"));
  const int64_t tokens = static_cast<int64_t>(info.tokens);
  std::vector<int32_t> doc_ids(tokens);
  POLYKV_RETURN_IF_ERROR(FromCStatus(
      polykv_pool_token_ids(guard.pool, doc_ids.data(), doc_ids.size()), "pool token ids"));
  const bool in_place = options_.attend == Attend::kInPlace &&
                        model_->weight_storage() == model::WeightStorage::kMapped &&
                        std::string(info.backend) == "host";
  AgentStats st;
  model::KvCache cache;
  POLYKV_RETURN_IF_ERROR(BuildCache(guard.pool, id, tokens, static_cast<int64_t>(input_ids.size()) + 1,
                                    std::move(doc_ids), in_place, &cache, &st));
  std::vector<double> nll;
  try {
    torch::NoGradGuard ng;
    for (size_t done = 0; done < input_ids.size();) {
      const size_t n = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(rows, 1)),
                                        input_ids.size() - done);
      POLYKV_ASSIGN_OR_RETURN(torch::Tensor logits,
                              model_->Forward(input_ids.subspan(done, n), cache, /*all_logits=*/true));
      std::vector<int64_t> tgt(target_ids.begin() + done, target_ids.begin() + done + n);
      torch::Tensor lp = torch::log_softmax(logits.to(torch::kFloat32).cpu(), -1)
                             .gather(1, torch::tensor(tgt, torch::kInt64).unsqueeze(1))
                             .to(torch::kFloat64)
                             .contiguous();
      for (size_t i = 0; i < n; ++i) nll.push_back(-lp.data_ptr<double>()[i]);
      done += n;
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("score: ", e.what()));
  }
  cache = model::KvCache();
  (void)guard.Release();
  return nll;
}

Status PooledAgent::BuildCache(::polykv_pool* pool, const std::string& id, int64_t tokens,
                               int64_t extra_capacity, std::vector<int32_t> doc_ids,
                               bool in_place, model::KvCache* cache, AgentStats* st) {
  const model::ModelConfig& cfg = model_->config();
  if (in_place) {
    const void* base = nullptr;
    uint64_t size = 0;
    POLYKV_RETURN_IF_ERROR(FromCStatus(polykv_pool_mapping(pool, &base, &size), "pool mapping"));
    POLYKV_ASSIGN_OR_RETURN(ipc::PoolReader reader,
                            ipc::PoolReader::Open(base, size, /*verify_payload=*/false));
    const ipc::PoolParams& p = reader.params();
    if (static_cast<int64_t>(p.tokens) != tokens)
      return absl::DataLossError(absl::StrCat("pool ", id, ": header holds ", p.tokens,
                                              " tokens, the daemon reported ", tokens));
    auto prefix = std::make_shared<model::KvPrefix>();
    POLYKV_ASSIGN_OR_RETURN(prefix->view, ipc::PrefixViewOf(reader));
    const kernels::PrefixView& v = prefix->view;
    // Every forward step's results count only if the lease was still valid after it.
    auto step = std::make_shared<int64_t>(0);
    prefix->check = [this, pool, id, step]() -> Status {
      if (hooks_.after_step) hooks_.after_step(*step);
      ++*step;
      const polykv_status s = polykv_pool_lease_status(pool);
      if (s != POLYKV_OK) return FromCStatus(s, absl::StrCat("lease of pool ", id));
      return absl::OkStatus();
    };
    st->prefix_bytes_per_token = static_cast<uint64_t>(v.LayerBytes()) * v.layers.size();
    POLYKV_ASSIGN_OR_RETURN(*cache, model_->NewCacheWithPrefix(std::move(prefix), std::move(doc_ids),
                                                               extra_capacity));
    return absl::OkStatus();
  }
  // Decompressed: every layer decoded into the private cache.
  POLYKV_ASSIGN_OR_RETURN(polykv_dtype cdtype, CDtypeOf(model_->dtype()));
  *cache = model_->NewCache(tokens + extra_capacity);
  if (static_cast<int32_t>(cache->k.size()) != cfg.layers || cache->capacity() < tokens)
    return absl::InternalError("model returned a cache of the wrong shape");
  polykv_pool_info info{};
  POLYKV_RETURN_IF_ERROR(FromCStatus(polykv_pool_get_info(pool, &info), "pool info"));
  auto host_opts = torch::TensorOptions().dtype(model_->dtype()).device(torch::kCPU);
  try {
    torch::Tensor k_buf = torch::empty({info.kv_heads, tokens, info.head_dim}, host_opts);
    torch::Tensor v_buf = torch::empty({info.kv_heads, tokens, info.head_dim}, host_opts);
    for (uint32_t l = 0; l < info.layers; ++l) {
      const polykv_status cs = polykv_decode_layer(pool, l, k_buf.data_ptr(), v_buf.data_ptr(), cdtype);
      if (cs != POLYKV_OK) {
        Status s = FromCStatus(cs, absl::StrCat("decode layer ", l, " of pool ", id));
        if (IsConnectionError(s)) Disconnect();
        return s;
      }
      cache->k[l].narrow(1, 0, tokens).copy_(k_buf);
      cache->v[l].narrow(1, 0, tokens).copy_(v_buf);
      if (hooks_.after_layer_decoded) hooks_.after_layer_decoded(l);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("copying decoded pool into the cache: ", e.what()));
  }
  // The data is only trusted while the lease is: refuse if eviction/expiry was seen.
  const polykv_status cs = polykv_pool_lease_status(pool);
  if (cs != POLYKV_OK) return FromCStatus(cs, absl::StrCat("lease of pool ", id));
  cache->tokens = std::move(doc_ids);
  cache->length = tokens;
  return absl::OkStatus();
}

StatusOr<BaselineResult> PooledAgent::RunBaseline(absl::Span<const int32_t> document_ids,
                                                  absl::Span<const int32_t> prompt_ids,
                                                  const model::SamplingOptions& sampling) {
  if (document_ids.empty()) return absl::InvalidArgumentError("empty document");
  if (prompt_ids.empty()) return absl::InvalidArgumentError("empty prompt: give at least one token");
  BaselineResult r;
  const int64_t n = static_cast<int64_t>(document_ids.size());
  const int64_t capacity =
      n + static_cast<int64_t>(prompt_ids.size()) + std::max<int32_t>(sampling.max_new_tokens, 0) + 1;
  auto t0 = Clock::now();
  model::KvCache cache = model_->NewCache(capacity);
  constexpr int64_t kChunk = 512;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    POLYKV_ASSIGN_OR_RETURN(torch::Tensor logits,
                            model_->Forward(document_ids.subspan(off, len), cache, false));
    (void)logits;
  }
  r.prefill_ms = MsSince(t0);
  if (options_.attend == Attend::kInPlace &&
      model_->weight_storage() == model::WeightStorage::kMapped) {
    // The document as a read-only raw prefix: the same split attention as a pool agent.
    POLYKV_ASSIGN_OR_RETURN(cache, model_->FreezeAsPrefix(
                                       std::move(cache), capacity - n));
  }
  POLYKV_ASSIGN_OR_RETURN(model::GenerateResult gen, model_->Generate(cache, prompt_ids, sampling));
  r.answer_ids = std::move(gen.tokens);
  r.answer_text = DecodeText(r.answer_ids);
  r.prompt_first_token_ms = gen.first_token_ms;
  r.ttft_ms = r.prefill_ms + gen.first_token_ms;
  r.generation_ms = gen.total_ms;
  r.private_kv_bytes = CacheBytes(cache);
  return r;
}

}  // namespace polykv::client

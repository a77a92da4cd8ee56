// PooledAgent: attach a polykvd pool, attend to it in place (or decode it into a private KV
// cache), generate.
#include "polykv/agent.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "polykv/client.h"
#include "polykv/ipc/pool_memory.h"
#include "polykv/kernels/attention.h"
#include "polykv/kernels/device_ops.h"
#include "polykv/model/cuda_llama.h"
#include "polykv/model/perplexity.h"
#include "polykv/model/prefill.h"

namespace polykv::client {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The C API's dtype codes are kernels::DType's (polykv_decode_layer casts one to the other).
static_assert(POLYKV_DTYPE_F32 == static_cast<int>(kernels::DType::kF32) &&
              POLYKV_DTYPE_F16 == static_cast<int>(kernels::DType::kF16) &&
              POLYKV_DTYPE_BF16 == static_cast<int>(kernels::DType::kBF16));

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

/// kInvalidArgument for an empty prompt or a token id outside [0, vocab).
Status CheckPromptIds(absl::Span<const int32_t> prompt_ids, int32_t vocab) {
  if (prompt_ids.empty())
    return absl::InvalidArgumentError("empty prompt: give at least one token");
  for (int32_t id : prompt_ids) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

/// OK when the agent can compute on `device`; checked before the model is loaded, so
/// `--device cuda` never ends in a CPU run. kUnimplemented (no CUDA in this build, or the CUDA
/// model runtime is not linked), kFailedPrecondition (no usable device, ordinal too large).
Status CheckAgentDevice(const AgentDevice& device) {
  if (device.kind == kernels::Device::kCpu) return absl::OkStatus();
  const std::string name = AgentDeviceName(device);
  POLYKV_RETURN_IF_ERROR(kernels::CheckDeviceAvailable(kernels::Device::kCuda));
  if (device.index >= kernels::CudaDeviceCount()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", name, ": this host has ", kernels::CudaDeviceCount(), " CUDA device(s)"));
  }
  if (model::CudaRuntimeBuilt()) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("--device ", name,
                   ": the CUDA agent runtime (model step on device_ops.h, attention in place on "
                   "the CUDA IPC pool) is not linked into this build; run with --device cpu "
                   "(and --allow-copy for a cuda pool)"));
}

/// Records a generation in `result`: the answer (ids and, with a tokenizer, text) and its
/// timings; TTFT adds the attach and decode times already in result->stats.
void RecordAnswer(const PooledAgent& agent, model::GenerateResult gen, AgentResult* result) {
  AgentStats& st = result->stats;
  result->answer_ids = std::move(gen.tokens);
  result->answer_text = agent.DecodeText(result->answer_ids);
  st.prompt_first_token_ms = gen.first_token_ms;
  st.ttft_ms = st.attach_ms + st.decode_ms + gen.first_token_ms;
  st.generation_ms = gen.total_ms;
  st.new_tokens = static_cast<int64_t>(result->answer_ids.size());
  st.tokens_per_s = gen.total_ms > 0 ? st.new_tokens * 1000.0 / gen.total_ms : 0;
}

// The kernels' view of an attached host pool, from the encoding the client library parsed
// at attach (polykv_pool_attention_view / polykv_pool_layer_view): no second header parse.
// device: a pool in CUDA memory (polykv_pool_device_*_view: device pointers).
StatusOr<kernels::PrefixView> PrefixViewOfPool(const polykv_pool* pool, uint64_t* parent_tokens,
                                               bool device = false) {
  polykv_attention_view a = polykv_attention_view_init();
  POLYKV_RETURN_IF_ERROR(FromCStatus(
      device ? polykv_pool_device_attention_view(pool, &a) : polykv_pool_attention_view(pool, &a),
      "pool attention view"));
  kernels::PrefixView v;
  v.kv_heads = static_cast<int32_t>(a.kv_heads);
  v.head_dim = static_cast<int32_t>(a.head_dim);
  v.tokens = static_cast<int64_t>(a.tokens);
  v.codec = a.codec == 0 ? kernels::PrefixCodec::kRaw : kernels::PrefixCodec::kK8V;
  v.raw_dtype = static_cast<kernels::DType>(a.raw_dtype);
  v.config.key_bits = a.key_bits;
  v.config.value_bits = a.value_bits;
  v.config.key_scale = static_cast<kernels::KeyScaleMode>(a.key_scale);
  v.config.norm_correction = a.norm_correction != 0;
  v.config.norm_dtype = static_cast<kernels::DType>(a.norm_dtype);
  v.config.rotation_seed = a.rotation_seed;
  v.layers.resize(a.layers);
  for (uint32_t l = 0; l < a.layers; ++l) {
    polykv_layer_view lv = polykv_layer_view_init();
    POLYKV_RETURN_IF_ERROR(FromCStatus(
        device ? polykv_pool_device_layer_view(pool, l, &lv) : polykv_pool_layer_view(pool, l, &lv),
        "pool layer view"));
    v.layers[l] = kernels::PrefixLayer{lv.k, lv.k_scales, lv.v, lv.v_norms,
                                       v.codec == kernels::PrefixCodec::kK8V ? lv.value_bits : 0};
  }
  POLYKV_RETURN_IF_ERROR(kernels::ValidatePrefixView(v));
  *parent_tokens = a.parent_tokens;
  return v;
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
  std::string msg = absl::StrCat(std::string(context), ": ",
                                 polykv_status_string(static_cast<polykv_status>(code)));
  if (detail != nullptr && detail[0] != '\0') absl::StrAppend(&msg, ": ", detail);
  return Status(static_cast<absl::StatusCode>(code), msg);
}

uint64_t PeakRssBytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux: kilobytes
}

uint64_t CacheBytes(const model::KvCache& cache) { return cache.bytes(); }

std::string ChatQuestionPrompt(std::string_view question) {
  return absl::StrCat("<|im_start|>user\n", std::string(question),
                      "<|im_end|>\n<|im_start|>assistant\n");
}

std::string ChatDocument(std::string_view document, std::string_view instruction) {
  return absl::StrCat("<|im_start|>system\n", std::string(instruction), "\n\n",
                      std::string(document), "<|im_end|>\n");
}

StatusOr<std::string> ChatDocumentFor(const model::Tokenizer* tokenizer, std::string_view document,
                                      std::string_view instruction) {
  if (tokenizer == nullptr || tokenizer->chat_template().empty())
    return ChatDocument(document, instruction);
  const model::ChatMessage system{
      "system", absl::StrCat(std::string(instruction), "\n\n", std::string(document))};
  POLYKV_ASSIGN_OR_RETURN(std::string text,
                          tokenizer->ApplyChatTemplate(absl::MakeConstSpan(&system, 1), false));
  // Some templates (Mistral's) fold the system message into the last user turn and render
  // nothing for a system turn alone: the document would silently be lost.
  if (text.find(system.content) == std::string::npos)
    return absl::UnimplementedError(
        "chat: the model's template does not render a system turn on its own (it folds the "
        "system message into a later turn, as Mistral's does), so the document cannot be a "
        "shared system-turn prefix: frame the document yourself");
  return text;
}

StatusOr<std::string> ChatTurnsAfterDocument(const model::Tokenizer* tokenizer,
                                             absl::Span<const model::ChatMessage> messages) {
  if (messages.empty()) return absl::InvalidArgumentError("chat: no messages to render");
  if (tokenizer == nullptr || tokenizer->chat_template().empty()) {
    std::string out;
    for (const model::ChatMessage& m : messages) {
      if (m.role == "user") {
        out += ChatQuestionPrompt(m.content);
      } else {
        absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
      }
    }
    if (messages.back().role != "user") out += "<|im_start|>assistant\n";
    return out;
  }
  // The system turn's text does not change how the turns after it render; a sentinel shows
  // where the template puts it.
  const std::string sentinel = "You answer questions about this article.\n\nPOLYKV_DOCUMENT_7f3a";
  std::vector<model::ChatMessage> conv;
  conv.push_back({"system", sentinel});
  POLYKV_ASSIGN_OR_RETURN(std::string prefix, tokenizer->ApplyChatTemplate(conv, false));
  conv.insert(conv.end(), messages.begin(), messages.end());
  POLYKV_ASSIGN_OR_RETURN(std::string full, tokenizer->ApplyChatTemplate(conv, true));
  if (full.size() < prefix.size() || full.compare(0, prefix.size(), prefix) != 0 ||
      prefix.find(sentinel) == std::string::npos ||
      full.find(sentinel, prefix.size()) != std::string::npos)
    return absl::UnimplementedError(
        "chat: the model's template does not render the system turn as a prefix of the "
        "conversation, so the turns after the pool's document cannot be cut out");
  return full.substr(prefix.size());
}

Status PooledAgent::AttachPool(const std::string& id, polykv_pool** pool, polykv_pool_info* info) {
  POLYKV_RETURN_IF_ERROR(EnsureConnected(nullptr));
  polykv_status cs = polykv_attach(client_, id.c_str(), pool);
  if (cs != POLYKV_OK) {
    Status s = FromCStatus(cs, absl::StrCat("attach pool ", id));
    if (IsConnectionError(s)) Disconnect();
    return s;
  }
  return FromCStatus(polykv_pool_get_info(*pool, info), "pool info");
}

struct PooledAgent::AttachedChain {
  std::vector<std::unique_ptr<PoolGuard>> guards;  ///< root first
  std::vector<polykv_pool_info> infos;             ///< root first
  int64_t tokens = 0;                              ///< positions of the whole chain
  uint64_t total_bytes = 0, bf16_bytes = 0;        ///< summed over the chain
  const polykv_pool_info& leaf() const { return infos.back(); }
  /// Records the chain in `result` (after its prompt_ids): the leaf's codec, the document's
  /// and the prompt's lengths and the pools' bytes.
  void Describe(AgentResult* result) const {
    AgentStats& st = result->stats;
    st.document_tokens = tokens;
    st.prompt_tokens = static_cast<int64_t>(result->prompt_ids.size());
    st.pool_bytes = total_bytes;
    st.pool_bf16_bytes = bf16_bytes;
    result->codec = leaf().codec;
  }
  /// OK while every pool of the chain holds a valid lease; else the first failing pool's
  /// status (callable after the chain is moved: it captures the pools and their ids).
  std::function<Status()> LeaseCheck() const {
    std::vector<polykv_pool*> pools;
    for (const auto& g : guards) pools.push_back(g->pool);
    return [pools, ids = infos]() -> Status {
      for (size_t i = 0; i < pools.size(); ++i) {
        const polykv_status s = polykv_pool_lease_status(pools[i]);
        if (s != POLYKV_OK) return FromCStatus(s, absl::StrCat("lease of pool ", ids[i].id));
      }
      return absl::OkStatus();
    };
  }
  /// The token ids of every pool, root first (positions 0 .. tokens - 1).
  StatusOr<std::vector<int32_t>> TokenIds() const {
    std::vector<int32_t> ids;
    ids.reserve(static_cast<size_t>(tokens));
    for (size_t i = 0; i < infos.size(); ++i) {
      std::vector<int32_t> part(infos[i].tokens);
      POLYKV_RETURN_IF_ERROR(FromCStatus(
          polykv_pool_token_ids(guards[i]->pool, part.data(), part.size()), "pool token ids"));
      ids.insert(ids.end(), part.begin(), part.end());
    }
    return ids;
  }
  /// Detaches the leaf first; the first error is returned (the others are still detached).
  Status Release() {
    Status first;
    for (auto it = guards.rbegin(); it != guards.rend(); ++it) {
      Status s = (*it)->Release();
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }
};

Status PooledAgent::AttachChain(const std::string& id, AttachedChain* chain) {
  constexpr size_t kMaxTreeDepth = 64;
  const model::ModelConfig& cfg = model_->config();
  std::vector<std::unique_ptr<PoolGuard>> guards;  // leaf first
  std::vector<polykv_pool_info> infos;
  for (std::string next = id; !next.empty();) {
    if (guards.size() >= kMaxTreeDepth) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", id, ": parent chain deeper than ", kMaxTreeDepth));
    }
    auto guard = std::make_unique<PoolGuard>();
    polykv_pool_info info = polykv_pool_info_init();
    POLYKV_RETURN_IF_ERROR(AttachPool(next, &guard->pool, &info));
    const std::string what = guards.empty() ? absl::StrCat("pool ", id)
                                            : absl::StrCat("parent pool ", info.id, " of ", id);
    // ---- every pool of the chain must come from this model ----
    if (model_->fingerprint() != info.model_fingerprint) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " was prefilled with model ", info.model, " (fingerprint ",
                       std::string(info.model_fingerprint).substr(0, 16),
                       "...) but this agent loaded ", options_.model_path, " (fingerprint ",
                       model_->fingerprint().substr(0, 16), "...): load the pool's model"));
    }
    if (static_cast<int32_t>(info.layers) != cfg.layers ||
        static_cast<int32_t>(info.kv_heads) != cfg.kv_heads ||
        static_cast<int32_t>(info.head_dim) != cfg.head_dim) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " shape layers=", info.layers, " kv_heads=", info.kv_heads,
                       " head_dim=", info.head_dim, " does not match the model (", cfg.layers, ", ",
                       cfg.kv_heads, ", ", cfg.head_dim, ")"));
    }
    if (info.tokens < 1) return absl::FailedPreconditionError(absl::StrCat(what, " is empty"));
    if (!infos.empty() && info.parent_tokens + info.tokens != infos.back().parent_tokens) {
      return absl::DataLossError(
          absl::StrCat(what, " ends at position ", info.parent_tokens + info.tokens,
                       " but its child follows ", infos.back().parent_tokens, " positions"));
    }
    next = info.parent;
    if (next.empty() && info.parent_tokens != 0) {
      return absl::DataLossError(
          absl::StrCat(what, " has no parent but follows ", info.parent_tokens, " positions"));
    }
    guards.push_back(std::move(guard));
    infos.push_back(info);
  }
  chain->guards.assign(std::make_move_iterator(guards.rbegin()),
                       std::make_move_iterator(guards.rend()));
  chain->infos.assign(infos.rbegin(), infos.rend());
  chain->tokens = static_cast<int64_t>(chain->leaf().parent_tokens + chain->leaf().tokens);
  for (const polykv_pool_info& i : chain->infos) {
    chain->total_bytes += i.total_bytes;
    chain->bf16_bytes += i.bf16_bytes;
  }
  return absl::OkStatus();
}

Status PooledAgent::RunOnDevice(AttachedChain& chain, absl::Span<const int32_t> prompt_ids,
                                const model::SamplingOptions& sampling, AgentResult* result) {
  AgentStats& st = result->stats;
  result->attend = Attend::kInPlace;
  const auto t0 = Clock::now();
  POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<model::KvPrefix> prefix,
                          ChainPrefix(chain, /*device=*/true, &st.prefix_bytes_per_token));
  st.decode_ms = MsSince(t0);
  POLYKV_ASSIGN_OR_RETURN(model::GenerateResult gen,
                          cuda_->Generate(prefix.get(), prompt_ids, sampling));
  RecordAnswer(*this, std::move(gen), result);
  const model::ModelConfig& c = cuda_->config();
  st.private_kv_bytes = uint64_t{2} * c.layers * c.kv_heads * c.head_dim * sizeof(float) *
                        (prompt_ids.size() + std::max<int32_t>(sampling.max_new_tokens, 0) + 1);
  st.device_bytes = cuda_->device_bytes() + st.private_kv_bytes;
  st.memory = ReadProcessMemory();
  if (hooks_.before_detach) hooks_.before_detach();
  return absl::OkStatus();
}

RouteInput PooledAgent::RouteInputFor(std::string_view pool_id) const {
  RouteInput in;
  in.device = options_.device;
  in.in_place = options_.attend == Attend::kInPlace;
  in.mapped_weights = model_->weight_storage() == model::WeightStorage::kMapped;
  in.allow_copy = options_.allow_copy;
  in.pool_id = pool_id;
  return in;
}

Status PooledAgent::PreRoute(const std::string& id) {
  // Before attaching: a cuda pool is refused without mapping it (no CUDA context here).
  POLYKV_RETURN_IF_ERROR(EnsureConnected(nullptr));
  polykv_pool_info info = polykv_pool_info_init();
  Status s = FromCStatus(polykv_pool_info_by_id(client_, id.c_str(), &info),
                         absl::StrCat("stats of pool ", id));
  if (IsConnectionError(s)) Disconnect();
  // A pool this daemon does not hold yet (NOT_FOUND: an ATTACH replicates it from a peer, or
  // answers NOT_FOUND itself) and a persisted pool not yet restored (no backend): decided
  // after attaching, from where the mapping lies.
  if (s.code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(s);
  if (info.backend[0] == '\0') return absl::OkStatus();
  RouteInput in = RouteInputFor(id);
  in.backend = info.backend;
  return RoutePool(in).status();
}

StatusOr<PoolRoute> PooledAgent::Route(const AttachedChain& chain) {
  std::optional<PoolRoute> route;
  for (size_t i = 0; i < chain.infos.size(); ++i) {
    // Where the attached mapping actually lies (not what a description says).
    int cuda_device = -1;
    POLYKV_RETURN_IF_ERROR(
        FromCStatus(polykv_pool_cuda_device(chain.guards[i]->pool, &cuda_device), "pool device"));
    const std::string id = chain.infos[i].id;
    RouteInput in = RouteInputFor(id);
    in.backend =
        ipc::PoolMemoryName(cuda_device >= 0 ? ipc::PoolMemory::kCuda : ipc::PoolMemory::kHost);
    POLYKV_ASSIGN_OR_RETURN(PoolRoute r, RoutePool(in));
    if (route && *route != r)
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", id, ": its parent chain lies in more than one backend"));
    route = r;
  }
  if (!route) return absl::InternalError("empty pool chain");
  return *route;
}

StatusOr<std::unique_ptr<PooledAgent>> PooledAgent::Create(const AgentOptions& options) {
  std::unique_ptr<PooledAgent> agent(new PooledAgent());
  agent->options_ = options;
  POLYKV_RETURN_IF_ERROR(CheckAgentDevice(options.device));
  model::LoadOptions load = options.load;
  load.threads = options.threads;
  POLYKV_ASSIGN_OR_RETURN(agent->model_, model::LlamaModel::Load(options.model_path, load));
  model::SetComputeThreads(options.threads);
  if (options.device.kind == kernels::Device::kCuda) {  // the CPU model: config, tokenizer
    POLYKV_ASSIGN_OR_RETURN(agent->cuda_,
                            model::CudaLlama::Load(options.model_path, options.device.index, load));
  }
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
    return FromCStatus(
        s, absl::StrCat("cannot reach polykvd at ",
                        options_.endpoint.empty() ? "the default endpoint" : options_.endpoint));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<int32_t>> PooledAgent::EncodePrompt(std::string_view text) const {
  const model::Tokenizer* tok = model_->tokenizer();
  if (tok == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", options_.model_path, " has no tokenizer: give the prompt as token ids"));
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
  AttachedChain chain;
  POLYKV_RETURN_IF_ERROR(AttachChain(std::string(pool_id), &chain));
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, chain.TokenIds());
  POLYKV_RETURN_IF_ERROR(chain.Release());
  return ids;
}

StatusOr<SharedPool> PooledAgent::AttachShared(std::string_view pool_id) {
  auto chain = std::make_shared<AttachedChain>();
  POLYKV_RETURN_IF_ERROR(PreRoute(std::string(pool_id)));
  POLYKV_RETURN_IF_ERROR(AttachChain(std::string(pool_id), chain.get()));
  POLYKV_ASSIGN_OR_RETURN(PoolRoute route, Route(*chain));
  if (route == PoolRoute::kCudaInPlace) return AttachSharedOnDevice(std::move(chain));
  if (route != PoolRoute::kHostInPlace)
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", std::string(pool_id), " lives on backend '", chain->leaf().backend,
        "': a batched host attends in place only: host pools on the CPU, cuda pools with "
        "--device cuda"));
  AgentStats st;
  model::KvCache cache;
  POLYKV_RETURN_IF_ERROR(BuildCache(*chain, 1, /*in_place=*/true, &cache, &st, chain));
  SharedPool sp;
  sp.codec = chain->leaf().codec;
  sp.pool_bytes = chain->total_bytes;
  sp.prefix_bytes_per_step = st.prefix_bytes_per_token;
  sp.prefix = cache.prefix;
  sp.token_ids = std::move(cache.tokens);
  return sp;
}

StatusOr<SharedPool> PooledAgent::AttachSharedOnDevice(std::shared_ptr<AttachedChain> chain) {
  SharedPool sp;
  POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<model::KvPrefix> prefix,
                          ChainPrefix(*chain, /*device=*/true, &sp.prefix_bytes_per_step));
  POLYKV_ASSIGN_OR_RETURN(sp.token_ids, chain->TokenIds());
  sp.codec = chain->leaf().codec;
  sp.pool_bytes = chain->total_bytes;
  sp.device = options_.device;
  prefix->owner = std::move(chain);
  sp.prefix = std::move(prefix);
  return sp;
}

StatusOr<AgentResult> PooledAgent::Run(std::string_view pool_id,
                                       absl::Span<const int32_t> prompt_ids,
                                       const model::SamplingOptions& sampling) {
  POLYKV_RETURN_IF_ERROR(CheckPromptIds(prompt_ids, model_->config().vocab));
  AgentResult result;
  result.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
  AgentStats& st = result.stats;

  // ---- attach the pool and its parent chain (connect lazily; a dead connection is rebuilt
  // on the next Run); every pool must come from this model ----
  auto t_attach = Clock::now();
  AttachedChain chain;
  POLYKV_RETURN_IF_ERROR(PreRoute(std::string(pool_id)));
  POLYKV_RETURN_IF_ERROR(AttachChain(std::string(pool_id), &chain));
  POLYKV_ASSIGN_OR_RETURN(result.route, Route(chain));
  st.attach_ms = MsSince(t_attach);
  chain.Describe(&result);

  // ---- the document's KV: views of the mapped pools, or decoded into a private cache ----
  auto t_decode = Clock::now();
  if (result.route == PoolRoute::kCudaInPlace) {
    POLYKV_RETURN_IF_ERROR(RunOnDevice(chain, prompt_ids, sampling, &result));
    (void)chain.Release();
    st.peak_rss_bytes = PeakRssBytes();
    return result;
  }
  const bool in_place = result.route == PoolRoute::kHostInPlace;
  result.attend = in_place ? Attend::kInPlace : Attend::kDecompressed;
  const int64_t extra =
      static_cast<int64_t>(prompt_ids.size()) + std::max<int32_t>(sampling.max_new_tokens, 0) + 1;
  model::KvCache cache;
  POLYKV_RETURN_IF_ERROR(BuildCache(chain, extra, in_place, &cache, &st));
  st.decode_ms = MsSince(t_decode);
  st.private_kv_bytes = CacheBytes(cache);
  if (result.route == PoolRoute::kCudaCopiedToHost)
    std::fprintf(stderr, "%s\n", CopyCostLine(pool_id, st.pool_bytes, st.private_kv_bytes).c_str());

  // ---- generate after the document ----
  POLYKV_ASSIGN_OR_RETURN(model::GenerateResult gen, model_->Generate(cache, prompt_ids, sampling));
  RecordAnswer(*this, std::move(gen), &result);
  st.private_kv_bytes = std::max<uint64_t>(st.private_kv_bytes, CacheBytes(cache));
  st.memory = ReadProcessMemory();
  if (hooks_.before_detach) hooks_.before_detach();
  cache = model::KvCache();  // no view of the pool may outlive the mapping

  // The answer was computed from data checked under a valid lease; a failing DETACH (e.g.
  // the pool was evicted meanwhile, or the daemon left) does not invalidate it.
  (void)chain.Release();
  st.peak_rss_bytes = PeakRssBytes();
  return result;
}

StatusOr<std::vector<double>> PooledAgent::Score(std::string_view pool_id,
                                                 absl::Span<const int32_t> input_ids,
                                                 absl::Span<const int32_t> target_ids,
                                                 int64_t rows) {
  if (input_ids.empty() || input_ids.size() != target_ids.size())
    return absl::InvalidArgumentError(absl::StrCat("score: ", input_ids.size(), " inputs and ",
                                                   target_ids.size(),
                                                   " targets (need equal, > 0)"));
  const model::ModelConfig& cfg = model_->config();
  for (absl::Span<const int32_t> span : {input_ids, target_ids})
    for (int32_t id : span)
      if (id < 0 || id >= cfg.vocab)
        return absl::InvalidArgumentError(
            absl::StrCat("score: token id ", id, " outside the vocabulary"));
  const std::string id(pool_id);
  AttachedChain chain;
  POLYKV_RETURN_IF_ERROR(PreRoute(id));
  POLYKV_RETURN_IF_ERROR(AttachChain(id, &chain));
  POLYKV_ASSIGN_OR_RETURN(const PoolRoute route, Route(chain));
  if (route == PoolRoute::kCudaInPlace) {  // on the device, the pools read where they lie
    uint64_t bytes_per_token = 0;
    POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<model::KvPrefix> prefix,
                            ChainPrefix(chain, /*device=*/true, &bytes_per_token));
    StatusOr<std::vector<double>> nll =
        cuda_->Score(prefix.get(), input_ids, target_ids, std::min<int64_t>(rows, 256));
    (void)chain.Release();
    return nll;
  }
  const bool in_place = route == PoolRoute::kHostInPlace;
  AgentStats st;
  model::KvCache cache;
  POLYKV_RETURN_IF_ERROR(
      BuildCache(chain, static_cast<int64_t>(input_ids.size()) + 1, in_place, &cache, &st));
  if (route == PoolRoute::kCudaCopiedToHost)
    std::fprintf(stderr, "%s\n", CopyCostLine(id, chain.total_bytes, CacheBytes(cache)).c_str());
  POLYKV_ASSIGN_OR_RETURN(std::vector<double> nll,
                          model::ScoreTokens(*model_, cache, input_ids, target_ids, rows));
  cache = model::KvCache();
  (void)chain.Release();
  return nll;
}

StatusOr<std::shared_ptr<model::KvPrefix>> PooledAgent::ChainPrefix(AttachedChain& chain,
                                                                    bool device,
                                                                    uint64_t* bytes_per_token) {
  auto prefix = std::make_shared<model::KvPrefix>();
  uint64_t bytes = 0;
  for (size_t i = 0; i < chain.infos.size(); ++i) {
    polykv_pool* pool = chain.guards[i]->pool;
    if (device) {  // every pool of the tree where this agent computes
      int where = -1;
      POLYKV_RETURN_IF_ERROR(FromCStatus(polykv_pool_cuda_device(pool, &where), "pool device"));
      if (where != options_.device.index)
        return absl::FailedPreconditionError(absl::StrCat(
            "pool ", chain.infos[i].id, " lies on cuda:", where, ", this agent computes on ",
            AgentDeviceName(options_.device), ": run it with --device cuda:", where));
    }
    uint64_t parent_tokens = 0;
    POLYKV_ASSIGN_OR_RETURN(kernels::PrefixView v, PrefixViewOfPool(pool, &parent_tokens, device));
    if (v.tokens != static_cast<int64_t>(chain.infos[i].tokens) ||
        parent_tokens != chain.infos[i].parent_tokens)
      return absl::DataLossError(absl::StrCat("pool ", chain.infos[i].id, ": header holds ",
                                              v.tokens, " tokens after ", parent_tokens,
                                              ", the daemon reported ", chain.infos[i].tokens,
                                              " after ", chain.infos[i].parent_tokens));
    bytes += static_cast<uint64_t>(v.LayerBytes()) * v.layers.size();
    if (i == 0) {
      prefix->view = std::move(v);
    } else {
      prefix->tail.push_back(std::move(v));
    }
  }
  // Every forward step's results count only if every lease of the chain was still valid
  // after it.
  auto step = std::make_shared<int64_t>(0);
  prefix->check = [this, step, leases = chain.LeaseCheck()]() -> Status {
    if (hooks_.after_step) hooks_.after_step(*step);
    ++*step;
    return leases();
  };
  *bytes_per_token = bytes;
  return prefix;
}

Status PooledAgent::BuildCache(AttachedChain& chain, int64_t extra_capacity, bool in_place,
                               model::KvCache* cache, AgentStats* st,
                               std::shared_ptr<const void> owner) {
  const model::ModelConfig& cfg = model_->config();
  const size_t n = chain.infos.size();
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> doc_ids, chain.TokenIds());
  // The data is only trusted while every lease of the chain is valid.
  const std::function<Status()> check_leases = chain.LeaseCheck();
  if (in_place) {
    POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<model::KvPrefix> prefix,
                            ChainPrefix(chain, /*device=*/false, &st->prefix_bytes_per_token));
    prefix->owner = std::move(owner);
    POLYKV_ASSIGN_OR_RETURN(
        *cache, model_->NewCacheWithPrefix(std::move(prefix), std::move(doc_ids), extra_capacity));
    return absl::OkStatus();
  }
  // Decompressed: every layer of every pool decoded into the private cache, each pool at its
  // own positions.
  POLYKV_ASSIGN_OR_RETURN(kernels::DType kv_dtype, model::KvDType(*model_));
  const auto cdtype = static_cast<polykv_dtype>(kv_dtype);
  if (kv_dtype != kernels::DType::kF32)
    return absl::UnimplementedError("the decompressed path decodes into an f32 KV cache only");
  try {
    *cache = model_->NewCache(chain.tokens + extra_capacity);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory for a private KV cache of ",
                                                     chain.tokens + extra_capacity, " positions"));
  }
  if (static_cast<int32_t>(cache->k.size()) != cfg.layers || cache->capacity < chain.tokens)
    return absl::InternalError("model returned a cache of the wrong shape");
  const int64_t cap = cache->capacity;
  std::vector<float> k_buf, v_buf;
  for (size_t i = 0; i < n; ++i) {
    const polykv_pool_info& info = chain.infos[i];
    const int64_t tokens = static_cast<int64_t>(info.tokens);
    const int64_t off = static_cast<int64_t>(info.parent_tokens);
    const int64_t hd = info.head_dim;
    k_buf.resize(static_cast<size_t>(info.kv_heads * tokens * hd));
    v_buf.resize(k_buf.size());
    for (uint32_t l = 0; l < info.layers; ++l) {
      const polykv_status cs =
          polykv_decode_layer(chain.guards[i]->pool, l, k_buf.data(), v_buf.data(), cdtype);
      if (cs != POLYKV_OK) {
        Status s = FromCStatus(cs, absl::StrCat("decode layer ", l, " of pool ", info.id));
        if (IsConnectionError(s)) Disconnect();
        return s;
      }
      // [kv_heads][tokens][head_dim] into the cache's [kv_heads][capacity][head_dim] at `off`.
      for (int64_t h = 0; h < info.kv_heads; ++h) {
        std::copy_n(k_buf.begin() + h * tokens * hd, tokens * hd,
                    cache->k[l].begin() + (h * cap + off) * hd);
        std::copy_n(v_buf.begin() + h * tokens * hd, tokens * hd,
                    cache->v[l].begin() + (h * cap + off) * hd);
      }
      if (hooks_.after_layer_decoded && i + 1 == n) hooks_.after_layer_decoded(l);
    }
  }
  // The data is only trusted while the leases are: refuse if eviction/expiry was seen.
  POLYKV_RETURN_IF_ERROR(check_leases());
  cache->tokens = std::move(doc_ids);
  cache->length = chain.tokens;
  return absl::OkStatus();
}

StatusOr<BaselineResult> PooledAgent::RunBaseline(absl::Span<const int32_t> document_ids,
                                                  absl::Span<const int32_t> prompt_ids,
                                                  const model::SamplingOptions& sampling) {
  if (document_ids.empty()) return absl::InvalidArgumentError("empty document");
  if (prompt_ids.empty())
    return absl::InvalidArgumentError("empty prompt: give at least one token");
  BaselineResult r;
  if (cuda_) {  // re-prefill document + prompt on the device (no prefix)
    std::vector<int32_t> all(document_ids.begin(), document_ids.end());
    all.insert(all.end(), prompt_ids.begin(), prompt_ids.end());
    POLYKV_ASSIGN_OR_RETURN(model::GenerateResult gen, cuda_->Generate(nullptr, all, sampling));
    r.answer_ids = std::move(gen.tokens);
    r.answer_text = DecodeText(r.answer_ids);
    r.prompt_first_token_ms = r.ttft_ms = r.prefill_ms = gen.first_token_ms;
    r.generation_ms = gen.total_ms;
    return r;
  }
  const int64_t n = static_cast<int64_t>(document_ids.size());
  const int64_t capacity = n + static_cast<int64_t>(prompt_ids.size()) +
                           std::max<int32_t>(sampling.max_new_tokens, 0) + 1;
  auto t0 = Clock::now();
  model::KvCache cache = model_->NewCache(capacity);
  constexpr int64_t kChunk = 512;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    POLYKV_ASSIGN_OR_RETURN(model::Logits logits,
                            model_->Forward(document_ids.subspan(off, len), cache, false));
    (void)logits;
  }
  r.prefill_ms = MsSince(t0);
  if (options_.attend == Attend::kInPlace &&
      model_->weight_storage() == model::WeightStorage::kMapped) {
    // The document as a read-only raw prefix: the same split attention as a pool agent.
    POLYKV_ASSIGN_OR_RETURN(cache, model_->FreezeAsPrefix(std::move(cache), capacity - n));
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

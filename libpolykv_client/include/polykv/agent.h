// PooledAgent: one agent process's view of a shared pool. Attaches a pool published by
// polykvd (through the C client library) and generates an answer to its own prompt after the
// shared document, attending to the pool where it lies.
//
// Flow of Run() (PolyKV paper, Patel & Joshi 2026, sec. 4 "agent attach"):
//   connect (once) -> ATTACH (lease + read-only map) -> check model fingerprint and shape
//   -> Attend::kInPlace (default): a KvCache whose read-only prefix is a view of the mapped
//      pool (kernels/attention.h reads int8 keys and packed values there; nothing of the
//      document is copied), plus a private suffix for the prompt and the answer; the lease is
//      checked after every forward step
//   -> Attend::kDecompressed: polykv_decode_layer for every layer into a private KvCache
//      [kv_heads][capacity][head_dim] (the paper's reference flow, kept for comparison)
//   -> LlamaModel::Generate(cache, prompt) (positions continue at the document length)
//   -> DETACH.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "polykv/agent_device.h"
#include "polykv/model/llama.h"
#include "polykv/status.h"

struct polykv_client;
struct polykv_pool;
struct polykv_pool_info_t;
namespace polykv::model {
class CudaLlama;
}

namespace polykv::client {

/// How an agent reads the shared document's KV.
enum class Attend : uint8_t {
  kInPlace = 0,      ///< attend to the mapped pool directly (host pools, mapped runtime)
  kDecompressed = 1  ///< decode the pool into a private cache first (the paper's flow)
};

/// "in-place" or "decompressed".
const char* AttendName(Attend a);
/// Parses "in-place" / "decompressed"; kInvalidArgument otherwise.
StatusOr<Attend> ParseAttend(std::string_view text);

/// How to build a PooledAgent.
struct AgentOptions {
  std::string model_path;   ///< HF folder or .gguf: must be the pool's model
  std::string endpoint;     ///< daemon endpoint; empty = $POLYKV_ENDPOINT / default
  int timeout_ms = 5000;    ///< per daemon request (Lazy Pirate inside the client)
  int threads = 0;          ///< compute threads (kernels' pool); 0 = all cores
  model::LoadOptions load;  ///< weights / quantized_rows (threads is taken from `threads`)
  /// In place needs a host pool and the mapped runtime; otherwise a host pool is decompressed
  /// (AgentResult::attend says which ran). A cuda pool is never copied to the host silently:
  /// see `device` and `allow_copy` (agent_device.h RoutePool).
  Attend attend = Attend::kInPlace;
  /// Where the agent computes (`--device cpu|cuda[:N]`). kCuda: Create uploads the weights to
  /// that device (model::CudaLlama) and Run attends in place to a pool in CUDA memory there;
  /// Create fails with kUnimplemented (build without CUDA) or kFailedPrecondition (no usable
  /// device / ordinal out of range) before loading anything: never a CPU run.
  AgentDevice device;
  /// `--allow-copy`: a CPU agent may read a cuda pool by decoding it on the device into a
  /// private host cache, logging one line with the bytes copied and the private memory it
  /// takes (CopyCostLine). Without it such a Run fails with kFailedPrecondition.
  bool allow_copy = false;
};

/// Memory of this process from /proc/self/smaps_rollup, in bytes.
struct ProcessMemory {
  uint64_t rss = 0;
  uint64_t pss = 0;
  uint64_t private_bytes = 0;  ///< Private_Clean + Private_Dirty (pages no other process maps)
  uint64_t anonymous = 0;      ///< memory backed by no file
};
/// Reads /proc/self/smaps_rollup (zeros where unavailable).
ProcessMemory ReadProcessMemory();

/// Timings and memory of one Run (milliseconds, bytes).
struct AgentStats {
  double attach_ms = 0;              ///< connect (first Run only) + ATTACH + map
  double decode_ms = 0;              ///< all layers decoded into the private cache
  double prompt_first_token_ms = 0;  ///< prompt forward + first new token (Generate TTFT)
  double ttft_ms = 0;                ///< attach + decode + prompt forward + first token
  double generation_ms = 0;          ///< the whole Generate call
  double tokens_per_s = 0;           ///< new tokens / generation time (0 when none)
  int64_t document_tokens = 0;       ///< tokens in the pool
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;
  uint64_t pool_bytes = 0;        ///< the shared region (mapped read-only, not private)
  uint64_t pool_bf16_bytes = 0;   ///< the document's cache held privately in bf16
  uint64_t private_kv_bytes = 0;  ///< bytes of this agent's own KvCache tensors (capacity);
                                  ///< in place: the suffix only
  /// In place: bytes of the shared prefix read per generated token (every layer's K codes,
  /// scales, V codes and norms); 0 when decompressed.
  uint64_t prefix_bytes_per_token = 0;
  uint64_t peak_rss_bytes = 0;  ///< getrusage(RUSAGE_SELF).ru_maxrss after the run
  /// --device cuda: device memory this agent holds (weights + workspace + KV suffix), bytes.
  uint64_t device_bytes = 0;
  ProcessMemory memory;  ///< after the run (before detaching the pool)
};

/// The answer of one Run.
struct AgentResult {
  std::vector<int32_t> answer_ids;   ///< new tokens (without the prompt)
  std::string answer_text;           ///< decoded answer ("" when the model has no tokenizer)
  std::vector<int32_t> prompt_ids;   ///< the prompt as fed after the document
  std::string codec;                 ///< the pool's codec ("k8v3", "none", ...)
  Attend attend = Attend::kInPlace;  ///< how the document's KV was read
  PoolRoute route = PoolRoute::kHostInPlace;  ///< where it lay and how it was read
  AgentStats stats;
};

/// Result of a baseline run that prefills the document itself (no pool).
struct BaselineResult {
  std::vector<int32_t> answer_ids;
  std::string answer_text;
  double prefill_ms = 0;             ///< document forward (chunks of 512)
  double prompt_first_token_ms = 0;  ///< prompt forward + first token
  double ttft_ms = 0;                ///< prefill + prompt forward + first token
  double generation_ms = 0;
  uint64_t private_kv_bytes = 0;
};

/// Hooks for tests (fault injection). Called on the Run thread.
struct AgentHooks {
  /// Decompressed: called after layer `layer` was decoded (before the next one).
  std::function<void(uint32_t layer)> after_layer_decoded;
  /// In place: called after forward step `step` (0 = the prompt), before the lease check
  /// that decides whether the step's results count.
  std::function<void(int64_t step)> after_step;
  /// Called once the answer is complete, before the pool is detached (the lease and the
  /// mapping are still held).
  std::function<void()> before_detach;
};

/// A pool (and its parent chain) held attached by a long-lived host (polykv-cli agents
/// serve): the read-only prefix its sessions attend to in place.
struct SharedPool {
  /// The chain's K/V where they lie (root pool in `view`, children in `tail`); its owner
  /// keeps every pool attached (leases renewed) until the last holder lets go; its check
  /// fails a step once a lease is lost (eviction, expiry).
  std::shared_ptr<const model::KvPrefix> prefix;
  std::vector<int32_t> token_ids;  ///< the chain's tokens (positions 0 .. tokens - 1)
  std::string codec;               ///< the leaf pool's codec ("k7c-v3-e4x2-nc-n16", "none", ...)
  uint64_t pool_bytes = 0;         ///< the mapped regions, summed over the chain
  /// Bytes of the prefix read by one step (every layer's K codes, scales, V codes, norms),
  /// once for all sessions of a batched step.
  uint64_t prefix_bytes_per_step = 0;
  /// Where `prefix` lies: the CPU (a host pool) or the agent's CUDA device (a cuda pool
  /// attached by an agent with --device cuda; its pointers are device memory there).
  AgentDevice device;
};

/// An agent: one loaded model (per process) that runs prompts against pools.
/// Not thread-safe: one Run at a time.
class PooledAgent {
 public:
  /// Loads the model (sets compute threads). Errors: those of LlamaModel::Load.
  /// The daemon connection is opened lazily by the first Run.
  static StatusOr<std::unique_ptr<PooledAgent>> Create(const AgentOptions& options);
  ~PooledAgent();
  PooledAgent(const PooledAgent&) = delete;
  PooledAgent& operator=(const PooledAgent&) = delete;

  /// Attaches `pool_id` (a child pool: its parent chain too), attends to it in place or
  /// decodes it into a private cache, generates from `prompt_ids` (appended after the
  /// document: every pool of the chain), detaches. Errors:
  ///  kNotFound (unknown or evicted pool: "pool <id> was evicted"),
  ///  kFailedPrecondition (lease expired, the pool's model fingerprint / shape does not
  ///  match the loaded model, or the pool lies where this agent cannot attend to it:
  ///  RoutePool, checked with a STATS request before anything is attached or mapped), kUnavailable
  ///  / kDeadlineExceeded (daemon gone; the next Run reconnects), kInvalidArgument (empty prompt,
  ///  ids outside the vocabulary), kDataLoss (bad pool header). Never returns data decoded after an
  ///  eviction was seen.
  StatusOr<AgentResult> Run(std::string_view pool_id, absl::Span<const int32_t> prompt_ids,
                            const model::SamplingOptions& sampling);
  /// Same, with prompt text encoded by the model's tokenizer (no BOS; special tokens such
  /// as <|im_start|> are parsed). Errors: kFailedPrecondition when the model has no
  /// tokenizer; as above.
  StatusOr<AgentResult> RunText(std::string_view pool_id, std::string_view prompt,
                                const model::SamplingOptions& sampling);

  /// Scores a continuation of the pool's document (polykv-cli eval's agents section): runs
  /// `input_ids` after the document (attending to the pool as Run does) and returns
  /// -log p(targets[i]) of each input position i (targets.size() == input.size()), computed
  /// in forwards of at most `rows` rows (--device cuda: CudaLlama::Score on the pools in
  /// place, at most 256 rows a forward). Errors as Run; kInvalidArgument for sizes or ids.
  StatusOr<std::vector<double>> Score(std::string_view pool_id, absl::Span<const int32_t> input_ids,
                                      absl::Span<const int32_t> target_ids, int64_t rows = 512);

  /// Baseline without a pool: prefills `document_ids` itself (Forward in chunks of 512),
  /// then generates from `prompt_ids` exactly as Run does: in place, the prefilled document
  /// becomes a read-only raw prefix (LlamaModel::FreezeAsPrefix), so with a codec-none pool
  /// both compute the same thing bit for bit.
  StatusOr<BaselineResult> RunBaseline(absl::Span<const int32_t> document_ids,
                                       absl::Span<const int32_t> prompt_ids,
                                       const model::SamplingOptions& sampling);

  /// Attaches `pool_id` and its parent chain for in-place attention and keeps them attached
  /// while the returned prefix lives (the agent must outlive it): a host pool on the CPU, a
  /// cuda pool (one segment) on this agent's device when it was created with --device cuda.
  /// Errors as Run; kFailedPrecondition for a pool that cannot be attended in place where
  /// this agent computes (a cuda pool for a CPU agent, or on another device).
  StatusOr<SharedPool> AttachShared(std::string_view pool_id);

  /// Reads the token ids an agent of the pool attends to (attach + read + detach): its parent
  /// chain's (pool tree) and its own. Errors as Run.
  StatusOr<std::vector<int32_t>> PoolTokenIds(std::string_view pool_id);

  /// Encodes prompt text with the model's tokenizer (no BOS). kFailedPrecondition without
  /// a tokenizer.
  StatusOr<std::vector<int32_t>> EncodePrompt(std::string_view text) const;
  /// Decodes ids to text ("" without a tokenizer).
  std::string DecodeText(absl::Span<const int32_t> ids) const;

  model::LlamaModel& model() { return *model_; }
  /// The CUDA runtime of an agent created with --device cuda; null otherwise.
  model::CudaLlama* cuda_model() { return cuda_.get(); }
  void set_hooks(AgentHooks hooks) { hooks_ = std::move(hooks); }

 private:
  PooledAgent() = default;
  /// The pools a Run attends to: the one asked for and its parent chain (pool tree), root
  /// first, each attached with its own lease (defined in agent.cc).
  struct AttachedChain;
  [[nodiscard]] Status EnsureConnected(double* connect_ms);
  /// Attaches pool `id` and every parent up to the root, checking that each was prefilled
  /// with this model and shape and that their positions follow one another. Errors: as Run;
  /// kDataLoss for a chain whose positions do not add up.
  [[nodiscard]] Status AttachChain(const std::string& id, AttachedChain* chain);
  /// RoutePool's input for this agent's options and pool `pool_id` (backend left empty).
  RouteInput RouteInputFor(std::string_view pool_id) const;
  /// Refuses pool `id` from its STATS before anything is attached or mapped when RoutePool
  /// would (a pool that reports no backend yet is decided after attaching).
  [[nodiscard]] Status PreRoute(const std::string& id);
  /// How the attached chain is read (RoutePool on where each mapping lies; every pool of the
  /// chain must route the same way).
  [[nodiscard]] StatusOr<PoolRoute> Route(const AttachedChain& chain);
  /// --device cuda: attends in place to the chain's pools in CUDA memory (a pool tree too)
  /// and generates on the device (CudaLlama). kFailedPrecondition for a pool on another
  /// device.
  /// AttachShared's cuda path: the chain's pools (a pool tree: root first) as a device
  /// prefix, owned by the chain.
  StatusOr<SharedPool> AttachSharedOnDevice(std::shared_ptr<AttachedChain> chain);
  /// The attached chain as one prefix: each pool's view where it lies (`device`: in this
  /// agent's CUDA memory, every pool on its device, else kFailedPrecondition), positions
  /// checked against the daemon's (kDataLoss), a check of every lease after each step (with
  /// the after_step hook); *bytes_per_token = the bytes one step reads of all of them.
  StatusOr<std::shared_ptr<model::KvPrefix>> ChainPrefix(AttachedChain& chain, bool device,
                                                         uint64_t* bytes_per_token);
  [[nodiscard]] Status RunOnDevice(AttachedChain& chain, absl::Span<const int32_t> prompt_ids,
                                   const model::SamplingOptions& sampling, AgentResult* result);
  /// Fills `cache` from the attached chain (positions 0 .. chain tokens - 1): prefix views of
  /// every pool (in place) or their decoded layers.
  /// In place, the prefix's owner is `owner` (null: none).
  [[nodiscard]] Status BuildCache(AttachedChain& chain, int64_t extra_capacity, bool in_place,
                                  model::KvCache* cache, AgentStats* st,
                                  std::shared_ptr<const void> owner = nullptr);
  void Disconnect();
  /// Connects if needed and attaches pool `id` into `*pool` (detached by the caller's guard),
  /// filling `*info`. A connection error drops the connection so the next call rebuilds it.
  [[nodiscard]] Status AttachPool(const std::string& id, ::polykv_pool** pool,
                                  ::polykv_pool_info_t* info);

  AgentOptions options_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<model::CudaLlama> cuda_;  ///< --device cuda only
  ::polykv_client* client_ = nullptr;
  AgentHooks hooks_;
};

/// ChatML user turn + assistant generation prompt for instruct models (SmolLM2):
/// "<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n".
std::string ChatQuestionPrompt(std::string_view question);

/// ChatML system turn holding a document, as the pool's document text:
/// "<|im_start|>system\n" + instruction + "\n\n" + document + "<|im_end|>\n".
std::string ChatDocument(std::string_view document, std::string_view instruction =
                                                        "You answer questions about this "
                                                        "article.");

/// The pool's document as a system turn rendered with the model's own chat template
/// (GGUF tokenizer.chat_template / tokenizer_config.json), content instruction + "\n\n" +
/// document, no generation prompt; ChatDocument (ChatML) when `tokenizer` is null or the
/// model ships no template. For SmolLM2-Instruct both are byte-equal. Errors: those of
/// Tokenizer::ApplyChatTemplate (kUnimplemented naming an unsupported construct,
/// kInvalidArgument when the template raises, e.g. Gemma's "System role not supported";
/// kUnimplemented when the rendering does not hold the document, as with Mistral's templates,
/// which fold the system message into the last user turn).
[[nodiscard]] StatusOr<std::string> ChatDocumentFor(const model::Tokenizer* tokenizer,
                                                    std::string_view document,
                                                    std::string_view instruction =
                                                        "You answer questions about this "
                                                        "article.");

/// The text an agent feeds after a ChatDocumentFor pool: `messages` (user / assistant turns)
/// rendered with the model's chat template as the continuation of a conversation whose first
/// turn is the pool's system turn, ending with the assistant generation prompt. Computed as
/// render(system + messages, generation prompt) minus its prefix render(system): the template
/// decides every byte. ChatQuestionPrompt (ChatML) for each user turn when `tokenizer` is
/// null or has no template. Errors: as ChatDocumentFor; kInvalidArgument for no messages;
/// kUnimplemented when the template does not render the system turn as a prefix of the
/// conversation, or repeats it in a later turn (the continuation cannot be cut out: Phi-3.5,
/// Mistral).
[[nodiscard]] StatusOr<std::string> ChatTurnsAfterDocument(
    const model::Tokenizer* tokenizer, absl::Span<const model::ChatMessage> messages);

/// Peak resident set size of this process in bytes (getrusage ru_maxrss).
uint64_t PeakRssBytes();

/// Bytes of the tensors of `cache` (K and V, all layers, at capacity).
uint64_t CacheBytes(const model::KvCache& cache);

/// Converts a C API status code + message into a Status (codes match absl).
[[nodiscard]] Status FromCStatus(int code, std::string_view context);

}  // namespace polykv::client

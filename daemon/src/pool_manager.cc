// polykvd's pools and leases (see pool_manager.h).
#include "pool_manager.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <random>

#include <spdlog/spdlog.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace polykv::daemon {
namespace {

using Clock = std::chrono::steady_clock;

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string Hex(const uint8_t* data, size_t n) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(data), n));
}

std::vector<uint8_t> Unhex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

std::string RandomLeaseId() {
  uint8_t bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<uint8_t>(rd());
  }
  return Hex(bytes, sizeof(bytes));
}

StatusOr<kernels::DType> DTypeOf(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return kernels::DType::kF32;
    case torch::kFloat16:
      return kernels::DType::kF16;
    case torch::kBFloat16:
      return kernels::DType::kBF16;
    default:
      return absl::UnimplementedError(
          absl::StrCat("KV dtype ", c10::toString(t), " is not supported by pools"));
  }
}

std::string CodecLabel(const ipc::PoolParams& p) {
  if (p.codec == ipc::PoolCodec::kNone) return "none";
  return absl::StrCat("k8v", p.codec_config.value_bits);
}

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

StatusOr<CodecChoice> ParseCodecName(const std::string& name) {
  if (name == "none") return CodecChoice{ipc::PoolCodec::kNone, 0};
  if (name == "k8v2") return CodecChoice{ipc::PoolCodec::kK8V, 2};
  if (name == "k8v3" || name.empty()) return CodecChoice{ipc::PoolCodec::kK8V, 3};
  if (name == "k8v4") return CodecChoice{ipc::PoolCodec::kK8V, 4};
  return absl::InvalidArgumentError(
      absl::StrCat("unknown codec \"", name, "\" (expected k8v2, k8v3, k8v4 or none)"));
}

StatusOr<kernels::KeyScaleMode> ParseKeyScale(const std::string& name) {
  if (name == "tensor" || name.empty()) return kernels::KeyScaleMode::kPerTensor;
  if (name == "head") return kernels::KeyScaleMode::kPerHead;
  if (name == "channel") return kernels::KeyScaleMode::kPerChannel;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown key_scale \"", name, "\" (expected tensor, head or channel)"));
}

std::string ComputePoolId(const std::string& model_fingerprint,
                          const std::string& tokenizer_fingerprint,
                          const ipc::PoolParams& p, const std::vector<int32_t>& token_ids) {
  std::string meta = absl::StrCat(
      "polykv-pool-v1", std::string(1, '\0'), model_fingerprint, std::string(1, '\0'),
      tokenizer_fingerprint, std::string(1, '\0'), "codec=", static_cast<uint32_t>(p.codec),
      ";key_bits=", p.codec_config.key_bits, ";value_bits=", p.codec_config.value_bits,
      ";key_scale=", static_cast<int>(p.codec_config.key_scale),
      ";seed=", p.codec_config.rotation_seed,
      ";norm_correction=", p.codec_config.norm_correction ? 1 : 0,
      ";raw_dtype=", static_cast<int>(p.raw_dtype), ";tokens=", token_ids.size(),
      std::string(1, '\0'));
  std::vector<uint8_t> ids(4 * token_ids.size());
  for (size_t i = 0; i < token_ids.size(); ++i) {
    uint32_t v = static_cast<uint32_t>(token_ids[i]);
    for (int b = 0; b < 4; ++b) ids[4 * i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  uint8_t digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, meta.data(), meta.size());
  EVP_DigestUpdate(ctx, ids.data(), ids.size());
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  return Hex(digest, len);
}

PoolManager::PoolManager(PoolManagerOptions options) : options_(std::move(options)) {
  if (!options_.loader) {
    const int threads = options_.threads;
    options_.loader = [threads](const std::string& path) {
      model::LoadOptions load;
      load.threads = threads;
      return model::LlamaModel::Load(path, load);
    };
  }
}

PoolManager::~PoolManager() { Shutdown(); }

void PoolManager::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  if (pools_.empty() && leases_.empty()) return;
  for (auto& [id, pool] : pools_) {
    if (pool.shm) segments_.erase(pool.shm->name());
    spdlog::info("released pool {} ({} bytes)", id.substr(0, 16), pool.info.total_bytes);
  }
  for (auto& [id, pool] : pools_) used_ -= pool.info.total_bytes;
  pools_.clear();
  leases_.clear();
  NotifySegmentsLocked();
}

StatusOr<std::string> PoolManager::ResolveModelPath(const std::string& name) const {
  if (name.empty()) return absl::InvalidArgumentError("model path is empty");
  struct stat st;
  if (!name.empty() && name[0] == '/') {
    if (stat(name.c_str(), &st) == 0) return name;
    return absl::NotFoundError(absl::StrCat("model \"", name, "\" does not exist"));
  }
  for (const auto& dir : options_.model_path) {
    std::string candidate = dir.empty() ? name : absl::StrCat(dir, "/", name);
    if (stat(candidate.c_str(), &st) == 0) return candidate;
  }
  if (stat(name.c_str(), &st) == 0) return name;
  return absl::NotFoundError(absl::StrCat("model \"", name, "\" not found (searched: ",
                                          absl::StrJoin(options_.model_path, ", "),
                                          options_.model_path.empty() ? "" : ", ",
                                          "the daemon's working directory)"));
}

StatusOr<PoolManager::ModelEntry*> PoolManager::GetModel(const std::string& resolved) {
  ModelEntry* entry;
  {
    std::lock_guard<std::mutex> lock(models_mu_);
    auto& slot = models_[resolved];
    if (!slot) slot = std::make_unique<ModelEntry>();
    entry = slot.get();
  }
  std::lock_guard<std::mutex> lock(entry->load_mu);
  if (!entry->loaded || !entry->status.ok()) {
    auto t0 = Clock::now();
    auto m = options_.loader(resolved);
    entry->loaded = true;
    if (!m.ok()) {
      entry->status = m.status();
      entry->loaded = false;  // retry on the next create (the file may be fixed)
      return m.status();
    }
    entry->model = *std::move(m);
    entry->status = absl::OkStatus();
    spdlog::info("loaded model {} in {:.0f} ms (fingerprint {})", resolved, MsSince(t0),
                 entry->model->fingerprint().substr(0, 16));
  }
  return entry;
}

StatusOr<CreateResult> PoolManager::CreatePool(const ipc::Request& request,
                                               const ProgressFn& progress_in) {
  ProgressFn progress = progress_in ? progress_in : [](const std::string&, int64_t, int64_t) {};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return absl::CancelledError("polykvd is shutting down");
  }
  POLYKV_ASSIGN_OR_RETURN(CodecChoice codec, ParseCodecName(request.codec));
  POLYKV_ASSIGN_OR_RETURN(kernels::KeyScaleMode key_scale, ParseKeyScale(request.key_scale));
  POLYKV_ASSIGN_OR_RETURN(std::string resolved, ResolveModelPath(request.model));
  POLYKV_ASSIGN_OR_RETURN(ModelEntry * entry, GetModel(resolved));
  model::LlamaModel& m = *entry->model;
  const model::ModelConfig& cfg = m.config();

  // Tokens.
  std::vector<int32_t> ids;
  const model::Tokenizer* tok = m.tokenizer();
  if (!request.token_ids.empty()) {
    ids = request.token_ids;
  } else {
    if (tok == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model \"", request.model, "\" has no tokenizer; send token_ids instead of text"));
    }
    progress("tokenize", 0, 1);
    POLYKV_ASSIGN_OR_RETURN(ids, tok->Encode(request.document, request.add_bos));
    progress("tokenize", 1, 1);
  }
  if (ids.empty()) return absl::InvalidArgumentError("the document has no tokens");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= cfg.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token_ids[", i, "] = ", ids[i],
                                                     " is outside the vocabulary of ",
                                                     cfg.vocab));
    }
  }
  if (cfg.max_positions > 0 && static_cast<int64_t>(ids.size()) > cfg.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("document of ", ids.size(),
                                                   " tokens exceeds the model's context of ",
                                                   cfg.max_positions));
  }

  // Pool parameters and content address.
  ipc::PoolParams params;
  params.layers = static_cast<uint32_t>(cfg.layers);
  params.kv_heads = static_cast<uint32_t>(cfg.kv_heads);
  params.head_dim = static_cast<uint32_t>(cfg.head_dim);
  params.tokens = ids.size();
  params.codec = codec.codec;
  if (codec.codec == ipc::PoolCodec::kK8V) params.codec_config.value_bits = codec.value_bits;
  params.codec_config.key_scale = key_scale;
  params.codec_config.norm_correction = request.norm_correction;
  POLYKV_ASSIGN_OR_RETURN(params.raw_dtype, DTypeOf(m.dtype()));
  params.model_fingerprint = m.fingerprint();
  params.tokenizer_fingerprint = tok != nullptr ? tok->Fingerprint() : "none";
  // Recorded for `pools show` (both follow from the fingerprints, so not part of the id).
  params.architecture = cfg.architecture;
  params.tokenizer_family = tok != nullptr ? tok->family() : "none";
  const std::string pool_id =
      ComputePoolId(params.model_fingerprint, params.tokenizer_fingerprint, params, ids);

  // Join an existing or in-flight create of the same content.
  std::shared_ptr<InFlight> flight;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (shutdown_) return absl::CancelledError("polykvd is shutting down");
      if (auto it = pools_.find(pool_id); it != pools_.end()) {
        return CreateResult{InfoLocked(it->second), false};
      }
      auto f = in_flight_.find(pool_id);
      if (f == in_flight_.end()) break;
      std::shared_ptr<InFlight> other = f->second;
      spdlog::info("create of pool {} joins the one in progress", pool_id.substr(0, 16));
      other->cv.wait(lock, [&] { return other->done; });
      if (!other->status.ok()) return other->status;
    }
    flight = std::make_shared<InFlight>();
    in_flight_[pool_id] = flight;
  }
  auto result = Build(request, request.model, entry, pool_id, params, ids, progress);
  {
    std::lock_guard<std::mutex> lock(mu_);
    flight->done = true;
    flight->status = result.ok() ? absl::OkStatus() : result.status();
    in_flight_.erase(pool_id);
  }
  flight->cv.notify_all();
  return result;
}

StatusOr<CreateResult> PoolManager::Build(const ipc::Request& request,
                                          const std::string& model_name, ModelEntry* entry,
                                          const std::string& pool_id,
                                          const ipc::PoolParams& params,
                                          const std::vector<int32_t>& ids,
                                          const ProgressFn& progress) {
  POLYKV_ASSIGN_OR_RETURN(ipc::PoolLayout layout, ipc::ComputePoolLayout(params));
  const uint64_t needed = layout.total_bytes;
  const bool cuda = options_.backend == "cuda";
  const std::string shm_name = options_.shm_prefix + pool_id.substr(0, 16);

  // Reserve memory against the cap.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (options_.memory_cap > 0 && used_ + needed > options_.memory_cap) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory cap exceeded on backend ", options_.backend, ": used ", used_, " of cap ",
          options_.memory_cap, " bytes, the pool needs ", needed, " bytes"));
    }
    used_ += needed;
    if (!cuda) segments_.insert(shm_name);
    NotifySegmentsLocked();
  }
  Pool pool;
  auto release_reservation = [&](const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= needed;
    pool.shm.reset();  // unlinks
    pool.arena.reset();
    segments_.erase(shm_name);
    NotifySegmentsLocked();
    spdlog::warn("create of pool {} failed: {}", pool_id.substr(0, 16), why.ToString());
    return why;
  };

  // Allocate the region.
  std::vector<uint8_t> host_staging;
  void* base = nullptr;
  kernels::Device write_device = kernels::Device::kCpu;
  if (cuda) {
    auto arena = ipc::CudaArena::Allocate(needed);
    if (!arena.ok()) return release_reservation(arena.status());
    pool.arena.emplace(*std::move(arena));
    if (entry->model->device().is_cuda()) {
      base = pool.arena->data();
      write_device = kernels::Device::kCuda;
    } else {
      host_staging.resize(needed);
      base = host_staging.data();
    }
  } else {
    auto shm = ipc::ShmRegion::Create(shm_name, needed);
    if (!shm.ok() && shm.status().code() == absl::StatusCode::kAlreadyExists) {
      // A leftover of a dead daemon with our prefix: it is not ours to keep.
      spdlog::warn("removing leftover shm object {}", shm_name);
      (void)ipc::ShmRegion::Remove(shm_name);
      shm = ipc::ShmRegion::Create(shm_name, needed);
    }
    if (!shm.ok()) return release_reservation(shm.status());
    pool.shm.emplace(*std::move(shm));
    base = pool.shm->data();
  }

  // Prefill.
  auto t0 = Clock::now();
  model::PrefillResult prefill;
  {
    std::lock_guard<std::mutex> run(entry->run_mu);
    progress("prefill", 0, static_cast<int64_t>(ids.size()));
    StatusOr<model::PrefillResult> r = absl::InternalError("prefill did not run");
    try {
      r = entry->model->Prefill(ids, options_.prefill_chunk,
                                [&](int64_t done, int64_t total) {
                                  progress("prefill", done, total);
                                });
    } catch (const std::exception& e) {
      r = absl::InternalError(absl::StrCat("prefill threw: ", e.what()));
    }
    if (!r.ok()) return release_reservation(r.status());
    prefill = *std::move(r);
  }
  const double prefill_ms = MsSince(t0);
  if (prefill.k.size() != params.layers || prefill.v.size() != params.layers) {
    return release_reservation(absl::InternalError(absl::StrCat(
        "prefill returned ", prefill.k.size(), " layers, expected ", params.layers)));
  }

  // Encode.
  t0 = Clock::now();
  std::vector<uint8_t> id_bytes = Unhex(pool_id);
  auto writer =
      ipc::PoolWriter::Create(base, needed, params, id_bytes, ids, write_device);
  if (!writer.ok()) return release_reservation(writer.status());
  for (uint32_t l = 0; l < params.layers; ++l) {
    try {
      torch::Tensor k = prefill.k[l].contiguous();
      torch::Tensor v = prefill.v[l].contiguous();
      if (k.numel() != static_cast<int64_t>(params.kv_heads * params.tokens * params.head_dim) ||
          v.numel() != k.numel()) {
        return release_reservation(absl::InternalError(
            absl::StrCat("layer ", l, " K/V have ", k.numel(), "/", v.numel(),
                         " elements, expected [kv_heads][tokens][head_dim]")));
      }
      if (write_device == kernels::Device::kCpu && k.is_cuda()) {
        k = k.cpu();
        v = v.cpu();
      }
      auto dtype = DTypeOf(k.scalar_type());
      if (!dtype.ok()) return release_reservation(dtype.status());
      Status s = writer->WriteLayer(l, k.data_ptr(), v.data_ptr(), *dtype);
      if (!s.ok()) {
        return release_reservation(
            Status(s.code(), absl::StrCat("encode layer ", l, ": ", s.message())));
      }
    } catch (const std::exception& e) {
      return release_reservation(absl::InternalError(absl::StrCat("encode threw: ", e.what())));
    }
    progress("encode", l + 1, params.layers);
  }
  prefill = model::PrefillResult();  // free the f32 K/V before publishing
  const double encode_ms = MsSince(t0);

  // Publish.
  t0 = Clock::now();
  progress("publish", 0, 1);
  if (Status s = writer->Finalize(); !s.ok()) return release_reservation(s);
  if (cuda && !host_staging.empty()) {
    if (Status s = pool.arena->CopyFromHost(0, host_staging.data(), needed); !s.ok()) {
      return release_reservation(s);
    }
    host_staging = {};
  }
  pool.memory.backend = cuda ? "cuda" : "host";
  pool.memory.size = needed;
  if (cuda) {
    auto h = pool.arena->Export(0, needed);
    if (!h.ok()) return release_reservation(h.status());
    pool.memory.cuda = *h;
  } else {
    pool.memory.shm_name = shm_name;
  }
  ipc::PoolInfo& info = pool.info;
  info.id = pool_id;
  info.model = model_name;
  info.model_fingerprint = params.model_fingerprint;
  info.architecture = params.architecture;
  info.tokenizer_family = params.tokenizer_family;
  info.codec = CodecLabel(params);
  info.backend = pool.memory.backend;
  info.tokens = params.tokens;
  info.layers = params.layers;
  info.kv_heads = params.kv_heads;
  info.head_dim = params.head_dim;
  info.total_bytes = needed;
  info.key_codes = layout.key_codes;
  info.key_scales = layout.key_scales;
  info.value_codes = layout.value_codes;
  info.value_norms = layout.value_norms;
  info.overhead = layout.overhead;
  info.bf16_bytes = ipc::Bf16CacheBytes(params);
  info.effective_ratio = static_cast<double>(info.bf16_bytes) / static_cast<double>(needed);
  info.created_unix_ms = UnixMs();
  info.prefill_ms = prefill_ms;
  info.encode_ms = encode_ms;
  CreateResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) {
      used_ -= needed;
      segments_.erase(shm_name);
      return absl::CancelledError("polykvd is shutting down");
    }
    info.publish_ms = MsSince(t0);
    pool.seq = ++seq_;
    auto [it, inserted] = pools_.emplace(pool_id, std::move(pool));
    POLYKV_CHECK(inserted);
    result.info = InfoLocked(it->second);
    result.created = true;
  }
  progress("publish", 1, 1);
  (void)request;
  spdlog::info("published pool {} ({}, {} tokens, {} bytes, {:.2f}x vs bf16; prefill {:.0f} ms, "
               "encode {:.0f} ms, publish {:.1f} ms)",
               pool_id.substr(0, 16), result.info.codec, result.info.tokens,
               result.info.total_bytes, result.info.effective_ratio, result.info.prefill_ms,
               result.info.encode_ms, result.info.publish_ms);
  return result;
}

StatusOr<std::string> PoolManager::ResolvePoolIdLocked(const std::string& id) const {
  if (id.empty()) return absl::InvalidArgumentError("pool id is empty");
  if (pools_.count(id)) return id;
  if (id.size() >= 8 && id.size() < 64 && IsHex(id)) {
    std::string found;
    for (auto it = pools_.lower_bound(id); it != pools_.end() && it->first.rfind(id, 0) == 0;
         ++it) {
      if (!found.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("pool id prefix ", id, " is ambiguous"));
      }
      found = it->first;
    }
    if (!found.empty()) return found;
  }
  return absl::NotFoundError(absl::StrCat("unknown pool ", id));
}

uint32_t PoolManager::LiveLeasesLocked(const std::string& pool_id) const {
  uint32_t n = 0;
  const auto now = Clock::now();
  for (const auto& [id, lease] : leases_) {
    if (lease.pool_id == pool_id && lease.expires > now) ++n;
  }
  return n;
}

ipc::PoolInfo PoolManager::InfoLocked(const Pool& pool) const {
  ipc::PoolInfo info = pool.info;
  info.leases = LiveLeasesLocked(pool.info.id);
  return info;
}

void PoolManager::NotifySegmentsLocked() {
  if (options_.on_segments_changed) {
    options_.on_segments_changed(std::vector<std::string>(segments_.begin(), segments_.end()));
  }
}

StatusOr<LeaseGrant> PoolManager::Attach(const std::string& pool_id, uint32_t client_pid) {
  std::lock_guard<std::mutex> lock(mu_);
  POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
  const Pool& pool = pools_.at(id);
  LeaseGrant g;
  g.lease_id = RandomLeaseId();
  g.lease_ms = options_.lease_ms;
  leases_[g.lease_id] =
      Lease{id, Clock::now() + std::chrono::milliseconds(options_.lease_ms), client_pid};
  g.expires_unix_ms = UnixMs() + options_.lease_ms;
  g.info = InfoLocked(pool);
  g.memory = pool.memory;
  return g;
}

StatusOr<LeaseGrant> PoolManager::Renew(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (evicted_leases_.count(lease_id)) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, ": pool evicted"));
  }
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.expires <= Clock::now()) {
    if (it != leases_.end()) leases_.erase(it);
    return absl::NotFoundError(absl::StrCat("unknown or expired lease ", lease_id));
  }
  it->second.expires = Clock::now() + std::chrono::milliseconds(options_.lease_ms);
  LeaseGrant g;
  g.lease_id = lease_id;
  g.lease_ms = options_.lease_ms;
  g.expires_unix_ms = UnixMs() + options_.lease_ms;
  if (auto p = pools_.find(it->second.pool_id); p != pools_.end()) {
    g.info = InfoLocked(p->second);
    g.memory = p->second.memory;
  }
  return g;
}

Status PoolManager::Detach(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (evicted_leases_.erase(lease_id)) return absl::OkStatus();  // pool already gone
  if (leases_.erase(lease_id) == 0) {
    return absl::NotFoundError(absl::StrCat("unknown or expired lease ", lease_id));
  }
  return absl::OkStatus();
}

Status PoolManager::Evict(const std::string& pool_id, bool force) {
  std::lock_guard<std::mutex> lock(mu_);
  POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
  const uint32_t live = LiveLeasesLocked(id);
  if (live > 0 && !force) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", id.substr(0, 16), " has ", live, " live lease(s); evict with force to drop it"));
  }
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.pool_id == id) {
      evicted_leases_.insert(it->first);
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  auto it = pools_.find(id);
  used_ -= it->second.info.total_bytes;
  if (it->second.shm) segments_.erase(it->second.shm->name());
  pools_.erase(it);  // unlinks the shm object / frees the device memory
  NotifySegmentsLocked();
  spdlog::info("evicted pool {}{}", id.substr(0, 16),
               live > 0 ? absl::StrCat(" (forced, ", live, " lease(s) invalidated)") : "");
  return absl::OkStatus();
}

int PoolManager::SweepExpiredLeases() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  int n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires <= now) {
      spdlog::info("lease {} on pool {} (pid {}) expired", it->first.substr(0, 8),
                   it->second.pool_id.substr(0, 16), it->second.client_pid);
      it = leases_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  // Bound the memory of invalidated-lease records.
  if (evicted_leases_.size() > 65536) evicted_leases_.clear();
  return n;
}

std::vector<ipc::PoolInfo> PoolManager::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int64_t, ipc::PoolInfo>> v;
  for (const auto& [id, pool] : pools_) v.emplace_back(pool.seq, InfoLocked(pool));
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ipc::PoolInfo> out;
  for (auto& [seq, info] : v) out.push_back(std::move(info));
  return out;
}

StatusOr<ipc::PoolInfo> PoolManager::Info(const std::string& pool_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
  return InfoLocked(pools_.at(id));
}

uint64_t PoolManager::memory_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

}  // namespace polykv::daemon

// polykvd's pools and leases (see pool_manager.h; the files by role are listed in
// pool_manager_internal.h): construction and shutdown, codec names, pool ids, counters and
// the helpers the other files share.
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "locked.h"
#include "pool_manager_internal.h"

namespace polykv::daemon {

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
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

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool IsFullPoolId(const std::string& id) {
  return id.size() == 64 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

uint64_t ModelWeightBytes(const model::ModelConfig& c, kernels::DType dtype) {
  const uint64_t hidden = static_cast<uint64_t>(std::max(0, c.hidden));
  const uint64_t vocab = static_cast<uint64_t>(std::max(0, c.vocab));
  const uint64_t hd = static_cast<uint64_t>(std::max(0, c.head_dim));
  const uint64_t qkv = static_cast<uint64_t>(std::max(0, c.heads + 2 * c.kv_heads)) * hd;
  const uint64_t o = static_cast<uint64_t>(std::max(0, c.heads)) * hd;
  const uint64_t ffn = static_cast<uint64_t>(std::max(0, c.ffn));
  const uint64_t per_layer = 2 * hidden + qkv * hidden + hidden * o + 3 * ffn * hidden;
  uint64_t params =
      vocab * hidden + hidden + static_cast<uint64_t>(std::max(0, c.layers)) * per_layer;
  if (!c.tied_embeddings) params += vocab * hidden;
  return params * static_cast<uint64_t>(kernels::DTypeSize(dtype));
}

// Mean and largest per-layer relative MSE into `info` (the pool's header keeps every layer).
void SetFidelity(const std::vector<float>& key, const std::vector<float>& value,
                 ipc::PoolInfo* info) {
  info->fidelity_layers = 0;
  info->key_rel_mse_mean = info->key_rel_mse_max = 0;
  info->value_rel_mse_mean = info->value_rel_mse_max = 0;
  if (key.empty() || key.size() != value.size() || key.size() > ipc::kPoolFidelityLayers) return;
  double ks = 0, vs = 0;
  for (size_t l = 0; l < key.size(); ++l) {
    ks += key[l];
    vs += value[l];
    info->key_rel_mse_max = std::max<double>(info->key_rel_mse_max, key[l]);
    info->value_rel_mse_max = std::max<double>(info->value_rel_mse_max, value[l]);
  }
  info->fidelity_layers = static_cast<uint32_t>(key.size());
  info->key_rel_mse_mean = ks / static_cast<double>(key.size());
  info->value_rel_mse_mean = vs / static_cast<double>(key.size());
}

uint64_t ModelHeldBytes(const model::LlamaModel& model, uint64_t* mapped) {
  if (model.weight_storage() == model::WeightStorage::kMapped) {
    const uint64_t m = static_cast<uint64_t>(std::max<int64_t>(0, model.WeightBytesPerToken()));
    *mapped = m;
    return m;
  }
  *mapped = 0;
  // A copy runtime computes in f32, f16 or bf16 (KvDType refuses any other, which no loader
  // makes); the estimate counts such a model as f32.
  auto dtype = model::KvDType(model);
  return ModelWeightBytes(model.config(), dtype.ok() ? *dtype : kernels::DType::kF32);
}

StatusOr<CodecChoice> ParseCodecName(const std::string& name_in) {
  const std::string name = name_in.empty() ? std::string(kDefaultPoolCodec) : name_in;
  CodecChoice c;
  POLYKV_ASSIGN_OR_RETURN(c.spec, ipc::ParseCodecSpec(name));
  if (!c.spec.rotation) {
    return absl::InvalidArgumentError(absl::StrCat("codec \"", ipc::Abbreviate(name, 48),
                                                   "\": pools always rotate values (norot is an "
                                                   "eval ablation)"));
  }
  c.codec = c.spec.none ? ipc::PoolCodec::kNone : ipc::PoolCodec::kK8V;
  c.value_bits = c.spec.none ? 0 : c.spec.value_bits;
  c.named_bits_only = name == "k8v2" || name == "k8v3" || name == "k8v4";
  return c;
}

StatusOr<kernels::KeyScaleMode> ParseKeyScale(const std::string& name) {
  if (name.empty()) return kernels::KeyScaleMode::kPerTensor;
  if (std::optional<kernels::KeyScaleMode> mode = ipc::ParseKeyScaleName(name)) return *mode;
  return absl::InvalidArgumentError(absl::StrCat("unknown key_scale \"", ipc::Abbreviate(name, 32),
                                                 "\" (expected tensor, head or channel)"));
}

std::string ComputePoolId(const std::string& model_fingerprint,
                          const std::string& tokenizer_fingerprint, const ipc::PoolParams& p,
                          const std::vector<int32_t>& token_ids) {
  std::string meta = absl::StrCat(
      "polykv-pool-v1", std::string(1, '\0'), model_fingerprint, std::string(1, '\0'),
      tokenizer_fingerprint, std::string(1, '\0'), "codec=", static_cast<uint32_t>(p.codec),
      ";key_bits=", p.codec_config.key_bits, ";value_bits=", p.codec_config.value_bits,
      ";key_scale=", static_cast<int>(p.codec_config.key_scale),
      ";seed=", p.codec_config.rotation_seed,
      ";norm_correction=", p.codec_config.norm_correction ? 1 : 0,
      ";raw_dtype=", static_cast<int>(p.raw_dtype), ";tokens=", token_ids.size(),
      std::string(1, '\0'));
  // Pool formats added later enter only when used, so earlier pools keep their ids.
  if (p.codec == ipc::PoolCodec::kK8V && p.codec_config.norm_dtype != kernels::DType::kF32) {
    absl::StrAppend(&meta, "norm_dtype=", static_cast<int>(p.codec_config.norm_dtype),
                    std::string(1, '\0'));
  }
  if (p.codec == ipc::PoolCodec::kK8V && !p.layer_value_bits.empty()) {
    absl::StrAppend(&meta, "layer_value_bits=", absl::StrJoin(p.layer_value_bits, ","),
                    std::string(1, '\0'));
  }
  // A child pool (pool tree): the same tokens after another parent are other KV.
  if (!p.parent_id.empty()) {
    absl::StrAppend(&meta, "parent=", p.parent_id, ";parent_tokens=", p.parent_tokens,
                    std::string(1, '\0'));
  }
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
  if (options_.model_cache_models == 0) options_.model_cache_models = 1;
  for (const auto& dir : options_.models_dirs) {
    std::string given = LexicalNormal(dir);
    if (!given.empty()) roots_given_.push_back(given);
    auto canonical = RealPath(dir);
    if (canonical.ok()) {
      roots_.push_back(*canonical);
    } else {
      spdlog::warn("model folder {} is not usable: {}", dir,
                   std::string(canonical.status().message()));
    }
  }
}

PoolManager::~PoolManager() { Shutdown(); }

void PoolManager::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_.store(true);
  if (pools_.empty() && leases_.empty()) return;
  for (auto& [id, pool] : pools_) {
    spdlog::info("released pool {} ({} bytes)", id.substr(0, 16), pool.info.total_bytes);
    used_ -= pool.info.total_bytes;
  }
  pools_.clear();
  leases_.clear();
  expiry_.clear();
}

bool PoolManager::Cancelled(const std::atomic<bool>* cancel) const {
  return shutdown_.load() || (cancel != nullptr && cancel->load());
}

uint64_t PoolManager::memory_used() const { return ReadLocked(mu_, used_); }

uint64_t PoolManager::lease_count() const {
  return ReadLockedBy(mu_, [&] { return leases_.size(); });
}

uint64_t PoolManager::replicated_count() const { return ReadLocked(mu_, replicated_); }

uint64_t PoolManager::restored_count() const { return ReadLocked(mu_, restored_); }

}  // namespace polykv::daemon

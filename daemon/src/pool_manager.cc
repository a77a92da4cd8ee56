// polykvd's pools and leases (see pool_manager.h).
#include "pool_manager.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace polykv::daemon {
namespace {

using Clock = std::chrono::steady_clock;

/// Thrown from the prefill progress callback to abandon a cancelled create (the model's
/// Prefill has no other way out; it unwinds through RAII locals only).
struct CreateCancelled : std::exception {
  const char* what() const noexcept override { return "create cancelled"; }
};

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

std::string CodecLabel(const ipc::PoolParams& p) { return ipc::PoolCodecLabel(p); }

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

/// `path` with "//", "." and ".." removed lexically ("" for a relative path). "/.." is "/".
std::string LexicalNormal(const std::string& path) {
  if (path.empty() || path[0] != '/') return "";
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.emplace_back(part);
  }
  return "/" + absl::StrJoin(parts, "/");
}

/// Whether `path` is `root` or lies under it (both normalized, absolute).
bool Under(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path[0] == '/';
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

bool UnderAny(const std::string& path, const std::vector<std::string>& roots) {
  for (const auto& r : roots) {
    if (Under(path, r)) return true;
  }
  return false;
}

StatusOr<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) {
    return Status(errno == ENOENT || errno == ENOTDIR ? absl::StatusCode::kNotFound
                                                      : absl::StatusCode::kPermissionDenied,
                  std::strerror(errno));
  }
  return std::string(buf);
}

std::string FdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

/// The path the kernel has for an open descriptor, or "" when /proc is unavailable.
std::string PathOfFd(int fd) {
  char buf[PATH_MAX];
  ssize_t n = readlink(FdPath(fd).c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

}  // namespace

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

namespace {

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

}  // namespace

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
  if (name == "tensor" || name.empty()) return kernels::KeyScaleMode::kPerTensor;
  if (name == "head") return kernels::KeyScaleMode::kPerHead;
  if (name == "channel") return kernels::KeyScaleMode::kPerChannel;
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

// ---- models ---------------------------------------------------------------------------

StatusOr<PoolManager::OpenedModel> PoolManager::OpenModel(const std::string& name,
                                                          const Requester& who) const {
  if (name.empty()) return absl::InvalidArgumentError("model path is empty");
  if (name.find('\0') != std::string::npos || name.size() > PATH_MAX) {
    return absl::InvalidArgumentError("model path is not a valid path");
  }
  const bool confined = !options_.models_dirs.empty();
  const std::string shown = ipc::Abbreviate(name, 256);
  if (!confined && !who.trusted_paths) {
    return absl::PermissionDeniedError(
        absl::StrCat("uid ", who.uid,
                     " may not name model files: this polykvd has no --models-dir, so only "
                     "its own uid and root may (ask its administrator to configure --models-dir)"));
  }
  const std::string outside =
      absl::StrCat("model \"", shown, "\" is outside the model folders (--models-dir ",
                   absl::StrJoin(options_.models_dirs, ", "), ")");
  // Candidates in search order. Under confinement every candidate is checked lexically
  // first, so the answer for a path outside the folders never depends on what is there.
  std::vector<std::string> candidates;
  if (name[0] == '/') {
    candidates.push_back(name);
  } else {
    for (const auto& dir : options_.model_path) {
      if (!dir.empty()) candidates.push_back(absl::StrCat(dir, "/", name));
    }
    for (const auto& dir : options_.models_dirs) candidates.push_back(absl::StrCat(dir, "/", name));
    if (!confined) candidates.push_back(name);
  }
  bool any_inside = false;
  Status last = absl::NotFoundError("not found");
  for (const std::string& candidate : candidates) {
    if (confined) {
      std::string lexical = LexicalNormal(candidate);
      if (lexical.empty()) {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof(cwd)) != nullptr)
          lexical = LexicalNormal(absl::StrCat(cwd, "/", candidate));
      }
      if (!UnderAny(lexical, roots_given_) && !UnderAny(lexical, roots_)) continue;
      any_inside = true;
    }
    auto canonical = RealPath(candidate);
    if (!canonical.ok()) {
      last = canonical.status();
      continue;
    }
    if (confined && !UnderAny(*canonical, roots_)) {
      return absl::PermissionDeniedError(
          absl::StrCat("model \"", shown,
                       "\" resolves (through a symlink) to a path outside the model "
                       "folders; refusing to open it"));
    }
    const int fd =
        open(canonical->c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
      last = Status(
          errno == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kPermissionDenied,
          std::strerror(errno));
      continue;
    }
    OpenedModel opened;
    opened.fd.Reset(fd);
    struct stat st;
    if (fstat(fd, &st) != 0) return absl::InternalError("fstat of the model failed");
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model \"", shown,
                       "\" is not a regular file or a folder (a FIFO, device or socket "
                       "would block or mislead the loader)"));
    }
    // The opened inode's own path, immune to a rename or symlink swap since realpath.
    std::string actual = PathOfFd(fd);
    if (actual.empty()) actual = *canonical;
    if (confined && !UnderAny(actual, roots_)) return absl::PermissionDeniedError(outside);
    if (S_ISDIR(st.st_mode)) {
      // An HF folder: the loader opens files inside by name. Refuse entries that are not
      // regular files or folders, and symlinks that lead outside the model folders.
      DIR* d = fdopendir(dup(fd));
      if (d == nullptr) return absl::InternalError("cannot list the model folder");
      Status bad;
      while (dirent* e = readdir(d)) {
        const std::string entry = e->d_name;
        if (entry == "." || entry == "..") continue;
        struct stat es;
        if (fstatat(fd, entry.c_str(), &es, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISLNK(es.st_mode)) {
          auto target = RealPath(absl::StrCat(actual, "/", entry));
          if (!target.ok()) continue;  // dangling: the loader reports it if it needs it
          if (confined && !UnderAny(*target, roots_)) {
            bad = absl::PermissionDeniedError(
                absl::StrCat("model folder \"", shown, "\" holds \"", ipc::Abbreviate(entry, 64),
                             "\", a symlink to a path outside the model folders"));
            break;
          }
          if (stat(target->c_str(), &es) != 0) continue;
        }
        if (!S_ISREG(es.st_mode) && !S_ISDIR(es.st_mode)) {
          bad = absl::InvalidArgumentError(
              absl::StrCat("model folder \"", shown, "\" holds \"", ipc::Abbreviate(entry, 64),
                           "\", which is not a regular file or folder"));
          break;
        }
      }
      closedir(d);
      POLYKV_RETURN_IF_ERROR(bad);
    }
    opened.key.canonical = actual;
    opened.key.dev = st.st_dev;
    opened.key.ino = st.st_ino;
    opened.key.size = static_cast<uint64_t>(st.st_size);
    opened.key.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    opened.loader_path = access(FdPath(fd).c_str(), F_OK) == 0 ? FdPath(fd) : actual;
    return opened;
  }
  if (confined) {
    if (!any_inside) return absl::PermissionDeniedError(outside);
    return absl::NotFoundError(absl::StrCat("model \"", shown,
                                            "\" not found in the model folders (",
                                            absl::StrJoin(options_.models_dirs, ", "), ")"));
  }
  if (name[0] == '/') {
    return Status(last.code() == absl::StatusCode::kNotFound ? absl::StatusCode::kNotFound
                                                             : absl::StatusCode::kPermissionDenied,
                  absl::StrCat("model \"", shown, "\" cannot be opened: ", last.message()));
  }
  return absl::NotFoundError(absl::StrCat(
      "model \"", shown, "\" not found (searched: ", absl::StrJoin(options_.model_path, ", "),
      options_.model_path.empty() ? "" : ", ", "the daemon's working directory)"));
}

StatusOr<std::shared_ptr<PoolManager::ModelEntry>> PoolManager::GetModel(
    OpenedModel opened, const std::string& name, const ProgressFn& progress) {
  std::shared_ptr<ModelEntry> entry;
  {
    std::lock_guard<std::mutex> lock(models_mu_);
    auto& slot = models_[opened.key];
    if (!slot) {
      slot = std::make_shared<ModelEntry>();
      slot->key = opened.key;
    }
    slot->last_used = ++model_tick_;
    entry = slot;
  }
  std::lock_guard<std::mutex> lock(entry->load_mu);
  if (entry->loaded) return entry;
  if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
  progress("load", 0, 1);
  auto t0 = Clock::now();
  StatusOr<std::unique_ptr<model::LlamaModel>> m = absl::InternalError("model loader did not run");
  try {
    m = options_.loader(opened.loader_path);
  } catch (const std::exception& e) {
    m = absl::InternalError(absl::StrCat("model loader threw: ", e.what()));
  }
  opened.fd.Reset();
  if (!m.ok()) {
    {
      std::lock_guard<std::mutex> models_lock(models_mu_);
      auto it = models_.find(opened.key);
      if (it != models_.end() && it->second == entry) models_.erase(it);  // retry next time
    }
    // The loader names the path it was given; show the requester's own name instead.
    std::string msg = absl::StrReplaceAll(m.status().message(), {{opened.loader_path, name}});
    return Status(m.status().code(), msg);
  }
  entry->model = *std::move(m);
  entry->bytes = ModelHeldBytes(*entry->model, &entry->mapped_bytes);
  entry->loaded = true;
  spdlog::info(
      "loaded model {} in {:.0f} ms ({} MiB of weights, {} MiB of them mapped from the "
      "file; fingerprint {})",
      opened.key.canonical, MsSince(t0), entry->bytes >> 20, entry->mapped_bytes >> 20,
      entry->model->fingerprint().substr(0, 16));
  progress("load", 1, 1);
  {
    std::lock_guard<std::mutex> models_lock(models_mu_);
    TrimModelCacheLocked(entry.get());
  }
  return entry;
}

void PoolManager::TrimModelCacheLocked(const ModelEntry* keep) {
  auto over = [&] {
    uint64_t bytes = 0;
    size_t count = 0;
    for (const auto& [key, e] : models_) {
      if (!e->loaded) continue;
      bytes += e->bytes;
      ++count;
    }
    return count > options_.model_cache_models ||
           (options_.model_cache_bytes > 0 && bytes > options_.model_cache_bytes);
  };
  while (over()) {
    // Least recently used entry that no create holds (use_count 1: only the cache).
    auto victim = models_.end();
    for (auto it = models_.begin(); it != models_.end(); ++it) {
      if (!it->second->loaded || it->second.get() == keep || it->second.use_count() > 1) continue;
      if (victim == models_.end() || it->second->last_used < victim->second->last_used) victim = it;
    }
    if (victim == models_.end()) return;  // everything else is in use: over the bound for now
    spdlog::info("model cache: dropped {} ({} MiB, least recently used)", victim->first.canonical,
                 victim->second->bytes >> 20);
    models_.erase(victim);
  }
}

ModelCacheStats PoolManager::model_cache() const {
  std::lock_guard<std::mutex> lock(models_mu_);
  ModelCacheStats s;
  s.capacity = static_cast<uint32_t>(options_.model_cache_models);
  for (const auto& [key, e] : models_) {
    if (!e->loaded) continue;
    s.bytes += e->bytes;
    s.mapped_bytes += e->mapped_bytes;
    ++s.models;
  }
  return s;
}

// ---- create ---------------------------------------------------------------------------

StatusOr<CreateResult> PoolManager::CreatePool(const ipc::Request& request,
                                               const ProgressFn& progress_in, const Requester& who,
                                               const std::atomic<bool>* cancel) {
  ProgressFn progress = progress_in ? progress_in : [](const std::string&, int64_t, int64_t) {};
  if (Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");
  // A child pool (pool tree): its parent chain first; the model and codec follow from it.
  std::shared_ptr<ParentChain> chain;
  if (!request.parent.empty()) {
    POLYKV_ASSIGN_OR_RETURN(chain, OpenParentChain(request.parent));
  }
  const ipc::PoolInfo* parent = chain ? &chain->infos.back() : nullptr;
  CodecChoice codec;
  kernels::KeyScaleMode key_scale = kernels::KeyScaleMode::kPerTensor;
  if (parent == nullptr) {
    POLYKV_ASSIGN_OR_RETURN(codec, ParseCodecName(request.codec));
    POLYKV_ASSIGN_OR_RETURN(key_scale, ParseKeyScale(request.key_scale));
  } else if (!request.codec.empty()) {
    // Another name for the parent's codec is fine; another codec is not.
    POLYKV_ASSIGN_OR_RETURN(codec, ParseCodecName(request.codec));
    ipc::PoolParams asked = chain->leaf_params;
    POLYKV_RETURN_IF_ERROR(ipc::ApplyCodecSpec(codec.spec, asked.layers, &asked));
    if (codec.named_bits_only) {  // "k8v3" names no key scale or norm correction
      asked.codec_config.key_scale = chain->leaf_params.codec_config.key_scale;
      asked.codec_config.norm_correction = chain->leaf_params.codec_config.norm_correction;
    }
    if (ipc::PoolCodecLabel(asked) != parent->codec) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a child pool takes its parent's codec: parent pool ", parent->id.substr(0, 16), " is ",
          parent->codec, ", the create asks for \"", ipc::Abbreviate(request.codec, 48), "\""));
    }
  }
  const std::string model_name =
      parent != nullptr && request.model.empty() ? parent->model : request.model;
  POLYKV_ASSIGN_OR_RETURN(OpenedModel opened, OpenModel(model_name, who));
  POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<ModelEntry> entry,
                          GetModel(std::move(opened), model_name, progress));
  model::LlamaModel& m = *entry->model;
  const model::ModelConfig& cfg = m.config();
  if (parent != nullptr && m.fingerprint() != parent->model_fingerprint) {
    return absl::InvalidArgumentError(
        absl::StrCat("model \"", ipc::Abbreviate(model_name, 256), "\" (fingerprint ",
                     m.fingerprint().substr(0, 16), ") is not the model parent pool ",
                     parent->id.substr(0, 16), " was prefilled with (", parent->model,
                     ", fingerprint ", parent->model_fingerprint.substr(0, 16), ")"));
  }
  const int64_t parent_tokens = chain ? static_cast<int64_t>(chain->tokens.size()) : 0;

  // Tokens.
  std::vector<int32_t> ids;
  const model::Tokenizer* tok = m.tokenizer();
  if (!request.token_ids.empty()) {
    ids = request.token_ids;
  } else {
    if (tok == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("model \"", ipc::Abbreviate(request.model, 256),
                       "\" has no tokenizer; send token_ids instead of text"));
    }
    POLYKV_RETURN_IF_ERROR(ipc::ValidateUtf8(request.document, "the document"));
    progress("tokenize", 0, 1);
    // A child's text continues its parent's: never a BOS in the middle of a sequence.
    POLYKV_ASSIGN_OR_RETURN(ids, tok->Encode(request.document, chain ? false : request.add_bos));
    progress("tokenize", 1, 1);
  }
  if (ids.empty()) return absl::InvalidArgumentError("the document has no tokens");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= cfg.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token_ids[", i, "] = ", ids[i],
                                                     " is outside the vocabulary of ", cfg.vocab));
    }
  }
  if (cfg.max_positions > 0 &&
      parent_tokens + static_cast<int64_t>(ids.size()) > cfg.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "document of ", ids.size(), " tokens",
        chain ? absl::StrCat(" after a parent chain of ", parent_tokens) : std::string(),
        " exceeds the model's context of ", cfg.max_positions));
  }

  // Pool parameters and content address.
  ipc::PoolParams params;
  params.layers = static_cast<uint32_t>(cfg.layers);
  params.kv_heads = static_cast<uint32_t>(cfg.kv_heads);
  params.head_dim = static_cast<uint32_t>(cfg.head_dim);
  params.tokens = ids.size();
  if (chain) {
    // The parent's codec parameters: the agents attend to the chain as one prefix.
    params.codec = chain->leaf_params.codec;
    params.codec_config = chain->leaf_params.codec_config;
    params.raw_dtype = chain->leaf_params.raw_dtype;
    params.parent_id = parent->id;
    params.parent_tokens = static_cast<uint64_t>(parent_tokens);
  } else {
    POLYKV_RETURN_IF_ERROR(ipc::ApplyCodecSpec(codec.spec, params.layers, &params));
    if (codec.named_bits_only) {  // "k8v3" & co.: key scale and norm correction as asked
      params.codec_config.key_scale = key_scale;
      params.codec_config.norm_correction = request.norm_correction;
    }
    POLYKV_ASSIGN_OR_RETURN(params.raw_dtype, model::KvDType(m));
  }
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
      if (Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");
      if (auto it = pools_.find(pool_id); it != pools_.end()) {
        return CreateResult{InfoLocked(it->second), false};
      }
      auto f = in_flight_.find(pool_id);
      if (f == in_flight_.end()) break;
      std::shared_ptr<InFlight> other = f->second;
      spdlog::info("create of pool {} joins the one in progress", pool_id.substr(0, 16));
      while (!other->done) {
        other->cv.wait_for(lock, std::chrono::milliseconds(100));
        if (Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");
      }
      if (!other->status.ok()) return other->status;
    }
    flight = std::make_shared<InFlight>();
    in_flight_[pool_id] = flight;
  }
  StatusOr<CreateResult> result = absl::InternalError("create did not run");
  std::optional<ipc::PoolFileManifest> persisted;
  if (options_.store) persisted = options_.store->Find(pool_id);
  if (persisted && persisted->info.id == pool_id) {
    // The same content was persisted by an earlier daemon: the id covers the model
    // fingerprint, so the loaded model is the one the file was made with.
    progress("publish", 0, 1);
    result = Restore(*persisted);
    if (result.ok()) progress("publish", 1, 1);
    if (!result.ok() && result.status().code() != absl::StatusCode::kResourceExhausted &&
        result.status().code() != absl::StatusCode::kCancelled) {
      spdlog::warn("pool {}: restoring it from the state folder failed ({}); prefilling",
                   pool_id.substr(0, 16), result.status().ToString());
      persisted.reset();
    }
  } else {
    persisted.reset();
  }
  if (!persisted) {
    result = Build(model_name, entry.get(), pool_id, params, ids, progress, cancel, chain.get());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    flight->done = true;
    flight->status = result.ok() ? absl::OkStatus() : result.status();
    in_flight_.erase(pool_id);
  }
  flight->cv.notify_all();
  {
    std::lock_guard<std::mutex> lock(models_mu_);
    entry.reset();
    TrimModelCacheLocked(nullptr);
  }
  return result;
}

// ---- creating a pool (Build and its steps) ----------------------------------------------

class PoolManager::RunSlot {
 public:
  explicit RunSlot(ModelEntry* entry) : entry_(entry) {}
  RunSlot(const RunSlot&) = delete;
  RunSlot& operator=(const RunSlot&) = delete;
  ~RunSlot() { Release(); }

  /// Waits until no other create runs the model, then holds it. kCancelled when `cancel`
  /// (or the daemon's shutdown) is seen while waiting.
  [[nodiscard]] Status Acquire(const PoolManager& manager, const std::atomic<bool>* cancel) {
    std::unique_lock<std::mutex> lock(entry_->run_state_mu);
    while (entry_->running) {
      entry_->run_cv.wait_for(lock, std::chrono::milliseconds(100));
      if (manager.Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");
    }
    entry_->running = true;
    held_ = true;
    return absl::OkStatus();
  }

  /// Hands the model to the next create (once; also done on destruction).
  void Release() {
    if (!held_) return;
    held_ = false;
    {
      std::lock_guard<std::mutex> lock(entry_->run_state_mu);
      entry_->running = false;
    }
    entry_->run_cv.notify_one();
  }

 private:
  ModelEntry* entry_;
  bool held_ = false;
};

class PoolManager::Reservation {
 public:
  Reservation(PoolManager* manager, uint64_t needed, Pool* pool)
      : manager_(manager), needed_(needed), pool_(pool) {}
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

  /// Unless dismissed: gives the bytes back and drops the half-made region and arena, under
  /// mu_ so that the cap never counts memory that is already gone.
  ~Reservation() {
    if (!held_) return;
    std::lock_guard<std::mutex> lock(manager_->mu_);
    manager_->used_ -= needed_;
    pool_->region.reset();  // the memfd goes away with its last descriptor
    pool_->arena.reset();
  }

  /// Reserves the bytes against the memory cap; kResourceExhausted when they do not fit.
  [[nodiscard]] Status Acquire() {
    std::lock_guard<std::mutex> lock(manager_->mu_);
    const PoolManagerOptions& options = manager_->options_;
    if (options.memory_cap > 0 && manager_->used_ + needed_ > options.memory_cap) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory cap exceeded on backend ", options.backend, ": used ", manager_->used_,
          " of cap ", options.memory_cap, " bytes, the pool needs ", needed_, " bytes"));
    }
    manager_->used_ += needed_;
    held_ = true;
    return absl::OkStatus();
  }

  /// The bytes now belong to the published pool: nothing is given back.
  void Dismiss() { held_ = false; }

 private:
  PoolManager* manager_;
  uint64_t needed_;
  Pool* pool_;
  bool held_ = false;
};

struct PoolManager::PendingPool {
  PendingPool(const std::string& id, const ipc::PoolParams& params, const ipc::PoolLayout& layout,
              bool cuda)
      : id(id), params(params), layout(layout), needed(layout.total_bytes), cuda(cuda) {}

  const std::string& id;
  const ipc::PoolParams& params;
  const ipc::PoolLayout layout;
  const uint64_t needed;  ///< layout.total_bytes
  const bool cuda;        ///< the cuda backend (else a sealed memfd on the host)
  Pool pool;
  std::vector<uint8_t> host_staging;  ///< a CUDA pool encoded on the host, before its copy
  void* base = nullptr;               ///< where the encoder writes
  kernels::Device write_device = kernels::Device::kCpu;
  std::optional<ipc::PoolWriter> writer;
  double prefill_ms = 0, encode_ms = 0;
  Clock::time_point publish_start;  ///< for publish_ms

  /// Fills pool.info from the parameters, the layout, the writer's fidelity and the timings.
  void Describe(const std::string& model_name) {
    ipc::PoolInfo& info = pool.info;
    info.id = id;
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
    SetFidelity(writer->key_rel_mse(), writer->value_rel_mse(), &info);
    info.bf16_bytes = ipc::Bf16CacheBytes(params);
    info.effective_ratio = static_cast<double>(info.bf16_bytes) / static_cast<double>(needed);
    info.parent = params.parent_id;
    info.parent_tokens = params.parent_tokens;
    info.created_unix_ms = UnixMs();
    info.prefill_ms = prefill_ms;
    info.encode_ms = encode_ms;
    info.origin = "prefill";
  }
};

namespace {

/// Logs why a create failed after its memory was reserved, and returns `why`.
Status CreateFailed(const std::string& pool_id, Status why) {
  if (why.code() == absl::StatusCode::kCancelled) {
    spdlog::info("create of pool {} cancelled", pool_id.substr(0, 16));
  } else {
    spdlog::warn("create of pool {} failed: {}", pool_id.substr(0, 16), why.ToString());
  }
  return why;
}

}  // namespace

StatusOr<CreateResult> PoolManager::Build(const std::string& model_name, ModelEntry* entry,
                                          const std::string& pool_id, const ipc::PoolParams& params,
                                          const std::vector<int32_t>& ids,
                                          const ProgressFn& progress,
                                          const std::atomic<bool>* cancel,
                                          const ParentChain* chain) {
  POLYKV_ASSIGN_OR_RETURN(ipc::PoolLayout layout, ipc::ComputePoolLayout(params));

  // Hold the model first (one forward pass at a time): memory is reserved only by the
  // create that is about to prefill, never by creates waiting their turn.
  RunSlot run(entry);
  POLYKV_RETURN_IF_ERROR(run.Acquire(*this, cancel));
  if (Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");

  // Reserve memory against the cap; every way out before the publish gives it back.
  PendingPool p(pool_id, params, layout, options_.backend == "cuda");
  Reservation reservation(this, p.needed, &p.pool);
  POLYKV_RETURN_IF_ERROR(reservation.Acquire());

  if (Status s = FillPool(entry, ids, progress, cancel, chain, &run, &p); !s.ok()) {
    return CreateFailed(pool_id, std::move(s));
  }
  p.Describe(model_name);
  PersistPool(&p);
  return PublishPool(&p, &reservation, progress, cancel, chain);
}

Status PoolManager::FillPool(ModelEntry* entry, const std::vector<int32_t>& ids,
                             const ProgressFn& progress, const std::atomic<bool>* cancel,
                             const ParentChain* chain, RunSlot* run, PendingPool* p) {
  POLYKV_RETURN_IF_ERROR(AllocateRegion(*entry, p));
  Clock::time_point t_encode;
  {
    POLYKV_ASSIGN_OR_RETURN(model::PrefillResult prefill,
                            PrefillForPool(entry, ids, progress, cancel, chain, p));
    t_encode = Clock::now();
    POLYKV_RETURN_IF_ERROR(EncodeLayers(prefill, ids, progress, cancel, p));
  }  // the f32 K/V are freed before publishing
  run->Release();
  p->encode_ms = MsSince(t_encode);
  return SealPool(progress, p);
}

Status PoolManager::AllocateRegion(const ModelEntry& entry, PendingPool* p) {
  if (p->cuda) {
    POLYKV_ASSIGN_OR_RETURN(ipc::CudaArena arena, ipc::CudaArena::Allocate(p->needed));
    p->pool.arena.emplace(std::move(arena));
    // The model prefills on the host: the pool is written into host staging and copied to
    // the device when published.
    (void)entry;
    p->host_staging.resize(p->needed);
    p->base = p->host_staging.data();
    return absl::OkStatus();
  }
  // A sealed memfd: no name anyone could squat, nothing left behind when we die. Shown as
  // "/memfd:<prefix without '/'><first 16 hex of id> (deleted)" in /proc/*/fd.
  const std::string region_name =
      (options_.shm_prefix.size() > 1 ? options_.shm_prefix.substr(1) : std::string("polykv-")) +
      p->id.substr(0, 16);
  POLYKV_ASSIGN_OR_RETURN(ipc::SealedRegion region,
                          ipc::SealedRegion::Create(region_name, p->needed));
  p->pool.region.emplace(std::move(region));
  p->base = p->pool.region->writable_data();
  return absl::OkStatus();
}

StatusOr<model::PrefillResult> PoolManager::PrefillForPool(
    ModelEntry* entry, const std::vector<int32_t>& ids, const ProgressFn& progress,
    const std::atomic<bool>* cancel, const ParentChain* chain, PendingPool* p) {
  progress("prefill", 0, static_cast<int64_t>(ids.size()));
  for (int waited = 0; waited < options_.test_create_delay_ms; waited += 20) {
    if (Cancelled(cancel)) return absl::CancelledError("create cancelled");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto t0 = Clock::now();
  StatusOr<model::PrefillResult> r = absl::InternalError("prefill did not run");
  try {
    auto on_chunk = [&](int64_t done, int64_t total) {
      if (Cancelled(cancel)) throw CreateCancelled();
      progress("prefill", done, total);
    };
    r = chain != nullptr ? model::PrefillAfterPrefix(*entry->model, chain->views, chain->tokens,
                                                     ids, options_.prefill_chunk, on_chunk)
                         : entry->model->Prefill(ids, options_.prefill_chunk, on_chunk);
  } catch (const CreateCancelled&) {
    r = absl::CancelledError("polykvd is shutting down: the create was cancelled");
  } catch (const std::exception& e) {
    r = absl::InternalError(absl::StrCat("prefill threw: ", e.what()));
  }
  if (!r.ok()) return r.status();
  p->prefill_ms = MsSince(t0);
  const uint32_t layers = p->params.layers;
  if (r->k.size() != layers || r->v.size() != layers) {
    return absl::InternalError(
        absl::StrCat("prefill returned ", r->k.size(), " layers, expected ", layers));
  }
  return r;
}

Status PoolManager::EncodeLayers(const model::PrefillResult& prefill,
                                 const std::vector<int32_t>& ids, const ProgressFn& progress,
                                 const std::atomic<bool>* cancel, PendingPool* p) {
  const ipc::PoolParams& params = p->params;
  std::vector<uint8_t> id_bytes = Unhex(p->id);
  POLYKV_ASSIGN_OR_RETURN(
      ipc::PoolWriter writer,
      ipc::PoolWriter::Create(p->base, p->needed, params, id_bytes, ids, p->write_device));
  p->writer.emplace(std::move(writer));
  for (uint32_t l = 0; l < params.layers; ++l) {
    if (Cancelled(cancel)) return absl::CancelledError("create cancelled");
    // Moved to the host when the pool is written there (a GPU prefill), else left in place.
    POLYKV_ASSIGN_OR_RETURN(
        model::PrefilledLayer kv,
        model::ExportPrefilledLayer(prefill, l, p->write_device == kernels::Device::kCpu));
    if (kv.elements() != static_cast<int64_t>(params.kv_heads * params.tokens * params.head_dim)) {
      return absl::InternalError(absl::StrCat("layer ", l, " K/V have ", kv.elements(),
                                              " elements, expected [kv_heads][tokens][head_dim]"));
    }
    Status s = p->writer->WriteLayer(l, kv.k(), kv.v(), kv.dtype());
    if (!s.ok()) return Status(s.code(), absl::StrCat("encode layer ", l, ": ", s.message()));
    progress("encode", l + 1, params.layers);
  }
  return absl::OkStatus();
}

Status PoolManager::SealPool(const ProgressFn& progress, PendingPool* p) {
  p->publish_start = Clock::now();
  progress("publish", 0, 1);
  POLYKV_RETURN_IF_ERROR(p->writer->Finalize());
  Pool& pool = p->pool;
  if (p->cuda && !p->host_staging.empty()) {
    POLYKV_RETURN_IF_ERROR(pool.arena->CopyFromHost(0, p->host_staging.data(), p->needed));
  }
  pool.memory.backend = p->cuda ? "cuda" : "host";
  pool.memory.size = p->needed;
  if (p->cuda) {
    POLYKV_ASSIGN_OR_RETURN(pool.memory.cuda, pool.arena->Export(0, p->needed));
    return absl::OkStatus();
  }
  // Seal, then check the payload once more: it is now immutable, and what agents will
  // map is exactly what the checksum in the header describes.
  POLYKV_RETURN_IF_ERROR(pool.region->Seal());
  auto reader = ipc::PoolReader::Open(pool.region->data(), pool.region->size(),
                                      /*verify_payload=*/true);
  if (!reader.ok()) {
    return Status(
        absl::StatusCode::kDataLoss,
        absl::StrCat("pool changed between encode and seal: ", reader.status().message()));
  }
  pool.memory.transport = "memfd";
  pool.memory.fd_socket = options_.fd_socket;
  return absl::OkStatus();
}

void PoolManager::PersistPool(PendingPool* p) {
  if (options_.store) {
    // Persist before publishing, so that an evict can never race the write. A pool that
    // cannot be written is still served (from memory only). Host pools are written from the
    // sealed memfd (the bytes agents will map), host-staged CUDA pools from the staging copy.
    const std::string& pool_id = p->id;
    const void* persist_from = nullptr;
    if (!p->cuda) {
      persist_from = p->pool.region->data();
    } else if (!p->host_staging.empty()) {
      persist_from = p->host_staging.data();
    }
    if (persist_from != nullptr) {
      auto tw = Clock::now();
      if (Status s = options_.store->Save(p->pool.info, persist_from, p->needed); !s.ok()) {
        spdlog::warn("pool {} is not persisted: {}", pool_id.substr(0, 16), s.ToString());
      } else {
        spdlog::debug("persisted pool {} in {:.1f} ms", pool_id.substr(0, 16), MsSince(tw));
      }
    } else {
      spdlog::info("pool {} was encoded on the device and is not persisted", pool_id.substr(0, 16));
    }
  }
  p->host_staging = {};
}

StatusOr<CreateResult> PoolManager::PublishPool(PendingPool* p, Reservation* reservation,
                                                const ProgressFn& progress,
                                                const std::atomic<bool>* cancel,
                                                const ParentChain* chain) {
  const std::string& pool_id = p->id;
  CreateResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Cancelled(cancel)) {
      return absl::CancelledError("polykvd is shutting down: the create was cancelled");
    }
    if (chain != nullptr && pools_.count(p->params.parent_id) == 0) {
      // Evicted meanwhile: a child without its parent cannot be attended to.
      if (options_.store) options_.store->Remove(pool_id);
      return absl::AbortedError(absl::StrCat("parent pool ", p->params.parent_id.substr(0, 16),
                                             " was evicted during the create of its child"));
    }
    p->pool.info.publish_ms = MsSince(p->publish_start);
    p->pool.seq = ++seq_;
    auto [it, inserted] = pools_.emplace(pool_id, std::move(p->pool));
    POLYKV_CHECK(inserted);
    reservation->Dismiss();  // the bytes are the published pool's now
    result.info = InfoLocked(it->second);
    result.created = true;
  }
  progress("publish", 1, 1);
  spdlog::info(
      "published pool {} ({}, {} tokens, {} bytes, {:.2f}x vs bf16; prefill {:.0f} ms, "
      "encode {:.0f} ms, publish {:.1f} ms)",
      pool_id.substr(0, 16), result.info.codec, result.info.tokens, result.info.total_bytes,
      result.info.effective_ratio, result.info.prefill_ms, result.info.encode_ms,
      result.info.publish_ms);
  return result;
}

// ---- pools and leases -----------------------------------------------------------------

StatusOr<std::shared_ptr<PoolManager::ParentChain>> PoolManager::OpenParentChain(
    const std::string& parent_id) {
  constexpr int kMaxTreeDepth = 64;
  bool restore = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = ResolvePoolIdLocked(parent_id);
    restore = !r.ok() && r.status().code() == absl::StatusCode::kNotFound && options_.store;
  }
  if (restore) {  // a persisted parent is published from its file first
    auto r = RestorePersisted(parent_id);
    if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) return r.status();
  }
  auto chain = std::make_shared<ParentChain>();
  std::vector<std::pair<ipc::UniqueFd, uint64_t>> fds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto resolved = ResolvePoolIdLocked(parent_id);
    if (!resolved.ok()) {
      return Status(resolved.status().code(),
                    absl::StrCat("parent pool: ", resolved.status().message()));
    }
    for (std::string id = *resolved; !id.empty();) {
      if (fds.size() >= kMaxTreeDepth) {
        return absl::FailedPreconditionError(absl::StrCat(
            "pool tree under ", resolved->substr(0, 16), " is deeper than ", kMaxTreeDepth));
      }
      auto it = pools_.find(id);
      if (it == pools_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("parent chain of ", resolved->substr(0, 16), " is broken: pool ",
                         id.substr(0, 16), " is not published"));
      }
      if (!it->second.region) {
        return absl::FailedPreconditionError(
            absl::StrCat("parent pool ", id.substr(0, 16), " is on the ", it->second.memory.backend,
                         " backend: pool trees are built from host pools"));
      }
      const int fd = fcntl(it->second.region->fd(), F_DUPFD_CLOEXEC, 0);
      if (fd < 0) {
        return absl::InternalError(absl::StrCat("dup of pool memfd: ", std::strerror(errno)));
      }
      fds.emplace_back(ipc::UniqueFd(fd), it->second.region->size());
      chain->infos.push_back(it->second.info);
      id = it->second.info.parent;
    }
  }
  std::reverse(fds.begin(), fds.end());
  std::reverse(chain->infos.begin(), chain->infos.end());
  for (size_t i = 0; i < fds.size(); ++i) {
    POLYKV_ASSIGN_OR_RETURN(ipc::SealedRegion map,
                            ipc::SealedRegion::MapSealed(std::move(fds[i].first), fds[i].second));
    chain->maps.push_back(std::move(map));
    const ipc::SealedRegion& r = chain->maps.back();
    POLYKV_ASSIGN_OR_RETURN(ipc::PoolReader reader,
                            ipc::PoolReader::Open(r.data(), r.size(), /*verify_payload=*/false));
    if (reader.params().parent_tokens != chain->tokens.size()) {
      return absl::DataLossError(absl::StrCat("pool ", chain->infos[i].id.substr(0, 16),
                                              " says it follows ", reader.params().parent_tokens,
                                              " positions, its parent chain holds ",
                                              chain->tokens.size()));
    }
    POLYKV_ASSIGN_OR_RETURN(kernels::PrefixView view, ipc::PrefixViewOf(reader));
    chain->views.push_back(std::move(view));
    const std::vector<int32_t> ids = reader.TokenIds();
    chain->tokens.insert(chain->tokens.end(), ids.begin(), ids.end());
    chain->leaf_params = reader.params();
  }
  return chain;
}

std::vector<std::string> PoolManager::ChildrenLocked(const std::string& id) const {
  std::vector<std::string> out;
  for (const auto& [child, pool] : pools_) {
    if (pool.info.parent == id) out.push_back(child);
  }
  return out;
}

int PoolManager::EvictTreeLocked(const std::string& id, std::vector<std::string>* files) {
  int n = 0;
  for (const std::string& child : ChildrenLocked(id)) n += EvictTreeLocked(child, files);
  auto pool = pools_.find(id);
  if (pool == pools_.end()) return n;
  uint32_t invalidated = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.pool_id == id) {
      evicted_leases_.insert(it->first);
      auto next = std::next(it);
      EraseLeaseLocked(it);
      it = next;
      ++invalidated;
    } else {
      ++it;
    }
  }
  used_ -= pool->second.info.total_bytes;
  pools_.erase(pool);  // closes the memfd (agents' mappings stay valid) / frees device memory
  if (options_.store) files->push_back(id);  // removed by the caller, without mu_
  spdlog::info(
      "evicted pool {}{}", id.substr(0, 16),
      invalidated > 0 ? absl::StrCat(" (forced, ", invalidated, " lease(s) invalidated)") : "");
  return n + 1;
}

StatusOr<std::string> PoolManager::ResolvePoolIdLocked(const std::string& id) const {
  if (id.empty()) return absl::InvalidArgumentError("pool id is empty");
  if (id.size() > 64 || !IsHex(id)) {
    return absl::NotFoundError(absl::StrCat("unknown pool ", ipc::Abbreviate(id, 64),
                                            " (a pool id is up to 64 lowercase hex chars)"));
  }
  if (pools_.count(id)) return id;
  if (id.size() >= 8 && id.size() < 64) {
    std::string found;
    for (auto it = pools_.lower_bound(id); it != pools_.end() && it->first.rfind(id, 0) == 0;
         ++it) {
      if (!found.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("pool id prefix ", id, " is ambiguous"));
      }
      found = it->first;
    }
    if (!found.empty()) return found;
  }
  if (id.size() < 8) {
    return absl::NotFoundError(absl::StrCat(
        "unknown pool ", id, " (a prefix names a pool only with 8 or more hex chars)"));
  }
  return absl::NotFoundError(absl::StrCat("unknown pool ", id));
}

void PoolManager::EraseLeaseLocked(std::map<std::string, Lease>::iterator it) {
  if (auto p = pools_.find(it->second.pool_id); p != pools_.end() && p->second.leases > 0) {
    --p->second.leases;
  }
  expiry_.erase(it->second.expiry);
  leases_.erase(it);
}

void PoolManager::DropExpiredLeasesLocked() {
  const auto now = Clock::now();
  while (!expiry_.empty() && expiry_.begin()->first <= now) {
    auto lease = leases_.find(expiry_.begin()->second);
    if (lease == leases_.end()) {  // cannot happen: the two maps move together
      expiry_.erase(expiry_.begin());
      continue;
    }
    spdlog::debug("lease {} on pool {} (pid {}) expired", lease->first.substr(0, 8),
                  lease->second.pool_id.substr(0, 16), lease->second.client_pid);
    EraseLeaseLocked(lease);
    ++expired_unreported_;
  }
}

ipc::PoolInfo PoolManager::InfoLocked(const Pool& pool) const {
  ipc::PoolInfo info = pool.info;
  info.leases = pool.leases;
  return info;
}

StatusOr<LeaseGrant> PoolManager::Attach(const std::string& pool_id, uint32_t client_pid) {
  if (options_.store) {
    // Lazy restore: a pool persisted by an earlier daemon is published on first attach.
    bool published;
    {
      std::lock_guard<std::mutex> lock(mu_);
      published = ResolvePoolIdLocked(pool_id).ok();
    }
    if (!published && options_.store->Find(pool_id)) {
      POLYKV_RETURN_IF_ERROR(RestorePersisted(pool_id).status());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
  Pool& pool = pools_.at(id);
  LeaseGrant g;
  g.lease_id = RandomLeaseId();
  g.lease_ms = options_.lease_ms;
  const auto expires = Clock::now() + std::chrono::milliseconds(options_.lease_ms);
  Lease lease{id, expiry_.emplace(expires, g.lease_id), client_pid};
  leases_.emplace(g.lease_id, std::move(lease));
  ++pool.leases;
  g.expires_unix_ms = UnixMs() + options_.lease_ms;
  g.info = InfoLocked(pool);
  g.memory = pool.memory;
  return g;
}

StatusOr<LeaseGrant> PoolManager::Renew(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  const std::string shown = ipc::Abbreviate(lease_id, 64);
  if (evicted_leases_.count(lease_id)) {
    return absl::NotFoundError(absl::StrCat("lease ", shown, ": pool evicted"));
  }
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown or expired lease ", shown));
  }
  expiry_.erase(it->second.expiry);
  it->second.expiry =
      expiry_.emplace(Clock::now() + std::chrono::milliseconds(options_.lease_ms), lease_id);
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
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown or expired lease ", ipc::Abbreviate(lease_id, 64)));
  }
  EraseLeaseLocked(it);
  return absl::OkStatus();
}

StatusOr<ipc::UniqueFd> PoolManager::PoolFd(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    if (evicted_leases_.count(lease_id)) return absl::NotFoundError("pool evicted");
    return absl::NotFoundError("unknown or expired lease");
  }
  auto p = pools_.find(it->second.pool_id);
  if (p == pools_.end()) return absl::NotFoundError("pool evicted");
  if (!p->second.region) {
    return absl::FailedPreconditionError("the pool is not a host pool (no descriptor to hand out)");
  }
  int fd = fcntl(p->second.region->fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("dup pool descriptor: ", std::strerror(errno)));
  }
  return ipc::UniqueFd(fd);
}

Status PoolManager::Evict(const std::string& pool_id, bool force) {
  // The state folder is read before the pool lock is taken (a slow disk must not stall every
  // other request): the manifests of all pool files, and the file of `pool_id` itself for a
  // pool that is only on disk. Files are removed after the lock is released.
  std::vector<ipc::PoolFileManifest> files;
  std::optional<ipc::PoolFileManifest> on_disk;
  if (options_.store) {
    bool published = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      published = ResolvePoolIdLocked(pool_id).ok();
    }
    if (!published) on_disk = options_.store->Find(pool_id);
    files = options_.store->List();
  }
  std::vector<std::string> remove;  // pool files to delete once mu_ is released
  Status s = EvictLocked(pool_id, force, files, on_disk, &remove);
  for (const std::string& id : remove) options_.store->Remove(id);
  return s;
}

Status PoolManager::EvictLocked(const std::string& pool_id, bool force,
                                const std::vector<ipc::PoolFileManifest>& files,
                                const std::optional<ipc::PoolFileManifest>& on_disk,
                                std::vector<std::string>* remove) {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  auto resolved = ResolvePoolIdLocked(pool_id);
  if (!resolved.ok()) {
    // A pool that is only on disk (not restored since the restart): remove its file.
    if (resolved.status().code() != absl::StatusCode::kNotFound || !on_disk) {
      return resolved.status();
    }
  }
  const std::string id = resolved.ok() ? *resolved : on_disk->info.id;
  // Its descendants: in memory, and persisted ones not restored since the restart.
  std::vector<std::string> children = ChildrenLocked(id);
  std::map<std::string, std::vector<std::string>> disk_children;  // parent -> children
  for (const ipc::PoolFileManifest& m : files) {
    if (!m.info.parent.empty() && pools_.count(m.info.id) == 0) {
      disk_children[m.info.parent].push_back(m.info.id);
    }
  }
  std::vector<std::string> disk_tree;  // persisted-only descendants of id
  for (std::vector<std::string> todo = {id}; !todo.empty();) {
    const std::string p = todo.back();
    todo.pop_back();
    for (const std::string& c : disk_children[p]) {
      disk_tree.push_back(c);
      todo.push_back(c);
    }
    for (const std::string& c : ChildrenLocked(p)) todo.push_back(c);
  }
  const size_t child_count = children.size() + disk_children[id].size();
  if (child_count > 0 && !force) {
    std::vector<std::string> names;
    for (const std::string& c : children) names.push_back(c.substr(0, 16));
    for (const std::string& c : disk_children[id]) names.push_back(c.substr(0, 16));
    return absl::FailedPreconditionError(
        absl::StrCat("pool ", id.substr(0, 16), " has ", child_count, " child pool(s) (",
                     absl::StrJoin(names, ", "),
                     "): evict them first, or evict with force to drop the whole subtree"));
  }
  if (resolved.ok()) {
    const uint32_t live = pools_.find(id)->second.leases;
    if (live > 0 && !force) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pool ", id.substr(0, 16), " has ", live, " live lease(s); evict with force to drop it"));
    }
  }
  for (const std::string& c : disk_tree) {
    remove->push_back(c);
    spdlog::info("evicted persisted pool {} (child of an evicted pool)", c.substr(0, 16));
  }
  if (!resolved.ok()) {
    remove->push_back(id);
    spdlog::info("evicted persisted pool {}", id.substr(0, 16));
    return absl::OkStatus();
  }
  EvictTreeLocked(id, remove);
  return absl::OkStatus();
}

int PoolManager::SweepExpiredLeases() {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLeasesLocked();
  const uint64_t n = expired_unreported_;
  expired_unreported_ = 0;
  // One line per sweep, however many leases a burst of dead agents left behind.
  if (n > 0) spdlog::info("{} lease(s) expired (not renewed); {} live", n, leases_.size());
  // Bound the memory of invalidated-lease records.
  if (evicted_leases_.size() > 65536) evicted_leases_.clear();
  return static_cast<int>(n);
}

std::vector<ipc::PoolInfo> PoolManager::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  const_cast<PoolManager*>(this)->DropExpiredLeasesLocked();
  std::vector<std::pair<int64_t, ipc::PoolInfo>> v;
  for (const auto& [id, pool] : pools_) v.emplace_back(pool.seq, InfoLocked(pool));
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ipc::PoolInfo> out;
  for (auto& [seq, info] : v) out.push_back(std::move(info));
  return out;
}

StatusOr<ipc::PoolInfo> PoolManager::Info(const std::string& pool_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const_cast<PoolManager*>(this)->DropExpiredLeasesLocked();
  POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
  return InfoLocked(pools_.at(id));
}

namespace {

ipc::PoolInfo DiskInfo(const ipc::PoolFileManifest& m, const PoolStore& store) {
  ipc::PoolInfo info = m.info;
  info.leases = 0;
  info.backend.clear();  // in no memory until it is restored
  info.state = "disk";
  info.state_detail = store.PathOf(m.info.id);
  return info;
}

ipc::PoolInfo QuarantinedInfo(const PoolStore::QuarantinedFile& q) {
  ipc::PoolInfo info;
  if (q.info) info = *q.info;
  if (info.id.empty()) info.id = q.id;
  info.leases = 0;
  info.backend.clear();
  info.state = "quarantined";
  info.state_detail = absl::StrCat(q.reason, " (", q.path, ")");
  return info;
}

}  // namespace

std::vector<ipc::PoolInfo> PoolManager::Catalog() const {
  // The files first, then the pools in memory: a pool restored in between is then shown
  // once, in memory (the later look).
  std::vector<ipc::PoolFileManifest> files;
  std::vector<PoolStore::QuarantinedFile> quarantined;
  if (options_.store) {
    files = options_.store->List();
    quarantined = options_.store->Quarantined();
  }
  std::vector<ipc::PoolInfo> out = List();
  std::set<std::string> held;
  for (ipc::PoolInfo& info : out) {
    held.insert(info.id);
    info.state = "memory";
  }
  for (const ipc::PoolFileManifest& m : files) {
    if (held.count(m.info.id)) continue;
    out.push_back(DiskInfo(m, *options_.store));
  }
  for (const PoolStore::QuarantinedFile& q : quarantined) out.push_back(QuarantinedInfo(q));
  return out;
}

StatusOr<ipc::PoolInfo> PoolManager::Describe(const std::string& pool_id) const {
  StatusOr<ipc::PoolInfo> info = Info(pool_id);
  if (info.ok()) {
    info->state = "memory";
    return info;
  }
  if (info.status().code() != absl::StatusCode::kNotFound || !options_.store) return info;
  if (pool_id.size() < 8) return info;
  if (auto m = options_.store->Find(pool_id)) return DiskInfo(*m, *options_.store);
  // The newest quarantined file of that id (or unique prefix of one).
  std::optional<PoolStore::QuarantinedFile> found;
  for (const PoolStore::QuarantinedFile& q : options_.store->Quarantined()) {
    if (q.id.rfind(pool_id, 0) != 0) continue;
    if (found && found->id != q.id) {
      return absl::InvalidArgumentError(absl::StrCat("pool id prefix ", pool_id, " is ambiguous"));
    }
    found = q;
  }
  if (found) return QuarantinedInfo(*found);
  return info;
}

uint64_t PoolManager::memory_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t PoolManager::lease_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leases_.size();
}

// ---- persisted pools (--state-dir) ----------------------------------------------------

StatusOr<CreateResult> PoolManager::Restore(const ipc::PoolFileManifest& m) {
  return PublishFilled(m.info, m.pool_bytes, "state", [&](void* dst, uint64_t size) {
    return options_.store->ReadInto(m.info.id, dst, size);
  });
}

StatusOr<CreateResult> PoolManager::PublishFilled(const ipc::PoolInfo& source_info, uint64_t needed,
                                                  const std::string& origin, const FillFn& fill) {
  const std::string& pool_id = source_info.id;
  const bool from_state = origin == "state";
  const bool cuda = options_.backend == "cuda";
  // The same memfd name as Build's ("/memfd:<prefix><first 16 hex of id> (deleted)").
  const std::string region_name =
      (options_.shm_prefix.size() > 1 ? options_.shm_prefix.substr(1) : std::string("polykv-")) +
      pool_id.substr(0, 16);
  auto t0 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
    if (options_.memory_cap > 0 && used_ + needed > options_.memory_cap) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory cap exceeded on backend ", options_.backend, ": used ", used_, " of cap ",
          options_.memory_cap, " bytes, ", from_state ? "persisted" : "replicated", " pool ",
          pool_id.substr(0, 16), " needs ", needed, " bytes"));
    }
    used_ += needed;
  }
  Pool pool;
  auto release = [&](const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= needed;
    pool.region.reset();  // the memfd goes away with its last descriptor
    pool.arena.reset();
    spdlog::warn("{} of pool {} failed: {}", from_state ? "restore" : "replication",
                 pool_id.substr(0, 16), why.ToString());
    return why;
  };
  // Allocate and fill exactly as Build does: a sealed memfd for host pools (filled through
  // its writable mapping, then sealed and checked once more), a CUDA arena from a host copy.
  std::vector<uint8_t> staging;
  void* base = nullptr;
  if (cuda) {
    auto arena = ipc::CudaArena::Allocate(needed);
    if (!arena.ok()) return release(arena.status());
    pool.arena.emplace(*std::move(arena));
    staging.resize(needed);
    base = staging.data();
  } else {
    auto region = ipc::SealedRegion::Create(region_name, needed);
    if (!region.ok()) return release(region.status());
    pool.region.emplace(*std::move(region));
    base = pool.region->writable_data();
  }
  // The state folder verifies the file's checksums and the pool (PoolReader::Open with the
  // payload check; a corrupt file is quarantined); a replica is verified here.
  if (Status s = fill(base, needed); !s.ok()) return release(s);
  if (!from_state) {
    auto reader = ipc::PoolReader::Open(base, needed, /*verify_payload=*/true);
    if (!reader.ok()) {
      return release(Status(absl::StatusCode::kDataLoss,
                            absl::StrCat("replica of pool ", pool_id.substr(0, 16),
                                         " does not verify: ", reader.status().message())));
    }
    const std::string header_id = absl::BytesToHexString(absl::string_view(
        reinterpret_cast<const char*>(reader->header().pool_id), sizeof(reader->header().pool_id)));
    if (header_id != pool_id || reader->params().tokens != source_info.tokens ||
        reader->params().parent_id != source_info.parent ||
        reader->params().model_fingerprint != source_info.model_fingerprint) {
      return release(
          Status(absl::StatusCode::kDataLoss,
                 absl::StrCat("replica of pool ", pool_id.substr(0, 16),
                              " holds another pool than announced (header id ",
                              header_id.substr(0, 16), ", ", reader->params().tokens, " tokens)")));
    }
    if (options_.store) {
      // Persisted like a pool built here, so a restart restores it instead of fetching again.
      if (Status s = options_.store->Save(source_info, base, needed); !s.ok()) {
        spdlog::warn("replica of pool {} is not persisted: {}", pool_id.substr(0, 16),
                     s.ToString());
      }
    }
  }
  pool.memory.backend = cuda ? "cuda" : "host";
  pool.memory.size = needed;
  if (cuda) {
    if (Status s = pool.arena->CopyFromHost(0, staging.data(), needed); !s.ok()) {
      return release(s);
    }
    staging = {};
    auto h = pool.arena->Export(0, needed);
    if (!h.ok()) return release(h.status());
    pool.memory.cuda = *h;
  } else {
    if (Status s = pool.region->Seal(); !s.ok()) return release(s);
    auto reader = ipc::PoolReader::Open(pool.region->data(), pool.region->size(),
                                        /*verify_payload=*/true);
    if (!reader.ok()) {
      return release(Status(
          absl::StatusCode::kDataLoss,
          absl::StrCat("pool changed between restore and seal: ", reader.status().message())));
    }
    pool.memory.transport = "memfd";
    pool.memory.fd_socket = options_.fd_socket;
  }
  pool.info = source_info;
  pool.info.origin = origin;
  if (pool.info.fidelity_layers == 0 && pool.region.has_value()) {
    // A manifest written before fidelity was recorded: the header may still hold it.
    if (auto reader = ipc::PoolReader::Open(pool.region->data(), pool.region->size(), false);
        reader.ok()) {
      std::vector<float> k, v;
      for (const ipc::LayerFidelity& f : reader->RecordedFidelity()) {
        k.push_back(static_cast<float>(f.key_rel_mse));
        v.push_back(static_cast<float>(f.value_rel_mse));
      }
      SetFidelity(k, v, &pool.info);
    }
  }
  pool.info.backend = pool.memory.backend;
  pool.info.leases = 0;
  CreateResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_.load()) {
      used_ -= needed;
      return absl::CancelledError("polykvd is shutting down");
    }
    pool.info.publish_ms = MsSince(t0);
    pool.seq = ++seq_;
    if (from_state)
      ++restored_;
    else
      ++replicated_;
    auto [it, inserted] = pools_.emplace(pool_id, std::move(pool));
    POLYKV_CHECK(inserted);
    result.info = InfoLocked(it->second);
    result.created = true;
    result.restored = from_state;
    result.replicated = !from_state;
  }
  spdlog::info("{} pool {} from {} ({}, {} tokens, {} bytes) in {:.1f} ms",
               from_state ? "restored" : "replicated", pool_id.substr(0, 16),
               from_state ? options_.store->PathOf(pool_id) : origin, result.info.codec,
               result.info.tokens, needed, result.info.publish_ms);
  return result;
}

StatusOr<ipc::PoolInfo> PoolManager::RestorePersisted(const std::string& id_or_prefix, int depth) {
  if (!options_.store) return absl::NotFoundError("polykvd runs without a state folder");
  std::optional<ipc::PoolFileManifest> m = options_.store->Find(id_or_prefix);
  if (!m)
    return absl::NotFoundError(absl::StrCat("unknown pool ", ipc::Abbreviate(id_or_prefix, 64)));
  const std::string id = m->info.id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
    if (auto it = pools_.find(id); it != pools_.end()) return InfoLocked(it->second);
  }
  if (!m->info.parent.empty()) {
    // A child pool (pool tree) is served only with its parent chain.
    bool published = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      published = pools_.count(m->info.parent) > 0;
    }
    if (!published && depth >= 64) {
      return absl::FailedPreconditionError(
          absl::StrCat("persisted pool ", id.substr(0, 16), ": parent chain deeper than 64"));
    }
    if (!published) {
      auto parent = RestorePersisted(m->info.parent, depth + 1);
      if (!parent.ok()) {
        spdlog::error(
            "state: pool {} needs its parent pool {}, which is not available ({}); "
            "not served",
            id.substr(0, 16), m->info.parent.substr(0, 16), std::string(parent.status().message()));
        return absl::FailedPreconditionError(absl::StrCat(
            "persisted pool ", id.substr(0, 16), " needs its parent pool ",
            m->info.parent.substr(0, 16), ", which is not available: ", parent.status().message()));
      }
    }
  }
  POLYKV_RETURN_IF_ERROR(
      CheckServableModel(m->info, absl::StrCat("persisted pool ", id.substr(0, 16))));
  // Join a create or restore of the same pool in progress.
  std::shared_ptr<InFlight> flight;
  POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::PoolInfo> existing, JoinOrRegisterFlight(id, &flight));
  if (existing) return *existing;
  auto result = Restore(*m);
  FinishFlight(id, flight, result.ok() ? absl::OkStatus() : result.status());
  if (!result.ok()) return result.status();
  return result->info;
}

Status PoolManager::CheckServableModel(const ipc::PoolInfo& info, const std::string& what) {
  // The pool's model must be present (inside the model folders, when configured) and the
  // same file it was made with. The daemon itself asks: a trusted requester.
  auto opened = OpenModel(info.model, Requester{});
  if (!opened.ok()) {
    spdlog::error("{} needs model \"{}\", which is absent ({}); not served", what, info.model,
                  std::string(opened.status().message()));
    return absl::FailedPreconditionError(absl::StrCat(what, " needs model \"", info.model,
                                                      "\", which is absent (",
                                                      opened.status().message(), ")"));
  }
  const std::string canonical = opened->key.canonical;
  auto entry =
      GetModel(*std::move(opened), info.model, [](const std::string&, int64_t, int64_t) {});
  if (!entry.ok()) {
    spdlog::error("{} needs model {}, which does not load ({}); not served", what, canonical,
                  std::string(entry.status().message()));
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": its model does not load: ", entry.status().message()));
  }
  const std::string fingerprint = (*entry)->model->fingerprint();
  {
    // Only the fingerprint was needed: let the cache bound apply again.
    std::lock_guard<std::mutex> lock(models_mu_);
    entry->reset();
    TrimModelCacheLocked(nullptr);
  }
  if (fingerprint != info.model_fingerprint) {
    spdlog::error(
        "{} was made with model {} of fingerprint {}, but this daemon's file has "
        "fingerprint {}; not served",
        what, info.model, info.model_fingerprint.substr(0, 16), fingerprint.substr(0, 16));
    return absl::FailedPreconditionError(absl::StrCat(
        what, " was made with a different model file than ", canonical, " (fingerprint ",
        info.model_fingerprint.substr(0, 16), " vs ", fingerprint.substr(0, 16), ")"));
  }
  return absl::OkStatus();
}

StatusOr<std::optional<ipc::PoolInfo>> PoolManager::JoinOrRegisterFlight(
    const std::string& id, std::shared_ptr<InFlight>* flight) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
    if (auto it = pools_.find(id); it != pools_.end()) return InfoLocked(it->second);
    auto f = in_flight_.find(id);
    if (f == in_flight_.end()) break;
    std::shared_ptr<InFlight> other = f->second;
    while (!other->done) {
      other->cv.wait_for(lock, std::chrono::milliseconds(100));
      if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
    }
    if (!other->status.ok()) return other->status;
  }
  *flight = std::make_shared<InFlight>();
  in_flight_[id] = *flight;
  return std::optional<ipc::PoolInfo>();
}

void PoolManager::FinishFlight(const std::string& id, const std::shared_ptr<InFlight>& flight,
                               const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    flight->done = true;
    flight->status = status;
    in_flight_.erase(id);
  }
  flight->cv.notify_all();
}

namespace {
bool IsFullPoolId(const std::string& id) {
  return id.size() == 64 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}
}  // namespace

StatusOr<CreateResult> PoolManager::Replicate(const std::string& pool_id,
                                              const std::atomic<bool>* cancel,
                                              const ProgressFn& progress, int depth) {
  constexpr int kMaxTreeDepth = 64;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
    if (auto id = ResolvePoolIdLocked(pool_id); id.ok()) {
      CreateResult r;
      r.info = InfoLocked(pools_.at(*id));
      return r;
    } else if (id.status().code() != absl::StatusCode::kNotFound) {
      return id.status();
    }
  }
  if (options_.store && options_.store->Find(pool_id)) {
    POLYKV_ASSIGN_OR_RETURN(ipc::PoolInfo info, RestorePersisted(pool_id));
    CreateResult r;
    r.info = info;
    r.restored = true;
    return r;
  }
  if (options_.peers == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown pool ", ipc::Abbreviate(pool_id, 64),
                                            " (and no peer daemons are configured)"));
  }
  // A full id joins a replication of the same pool at once; a prefix once a peer named it.
  std::shared_ptr<InFlight> flight;
  std::string id;
  auto published = [](const ipc::PoolInfo& info) {
    CreateResult r;
    r.info = info;
    return r;
  };
  if (IsFullPoolId(pool_id)) {
    id = pool_id;
    POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::PoolInfo> existing,
                            JoinOrRegisterFlight(id, &flight));
    if (existing) return published(*existing);
  }
  auto finish = [&](StatusOr<CreateResult> r) -> StatusOr<CreateResult> {
    if (flight) FinishFlight(id, flight, r.ok() ? absl::OkStatus() : r.status());
    return r;
  };
  auto offer = options_.peers->Find(pool_id);
  if (!offer.ok()) return finish(offer.status());
  struct ReleaseOnExit {
    PeerSource* peers;
    const PeerSource::Offer* offer;
    ~ReleaseOnExit() { peers->Release(*offer); }
  } release_on_exit{options_.peers, &*offer};
  if (!IsFullPoolId(offer->info.id) || (!id.empty() && offer->info.id != id)) {
    return finish(absl::DataLossError(absl::StrCat("peer ", offer->peer, " answered for pool ",
                                                   ipc::Abbreviate(pool_id, 64), " with pool id \"",
                                                   ipc::Abbreviate(offer->info.id, 64), "\"")));
  }
  if (id.empty()) {
    id = offer->info.id;
    POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::PoolInfo> existing,
                            JoinOrRegisterFlight(id, &flight));
    if (existing) return published(*existing);
  }
  const std::string what = absl::StrCat("peer pool ", id.substr(0, 16), " from ", offer->peer);
  if (!offer->info.parent.empty()) {
    // A child pool (pool tree) is served only with its parent chain: replicate it first.
    if (depth >= kMaxTreeDepth) {
      return finish(absl::FailedPreconditionError(
          absl::StrCat(what, ": parent chain deeper than ", kMaxTreeDepth)));
    }
    auto parent = Replicate(offer->info.parent, cancel, progress, depth + 1);
    if (!parent.ok()) {
      return finish(Status(parent.status().code(), absl::StrCat(what, " needs its parent pool ",
                                                                offer->info.parent.substr(0, 16),
                                                                ": ", parent.status().message())));
    }
  }
  if (Status s = CheckServableModel(offer->info, what); !s.ok()) return finish(s);
  if (Cancelled(cancel)) return finish(absl::CancelledError("the fetch was cancelled"));
  const auto t0 = Clock::now();
  auto result = PublishFilled(
      offer->info, offer->pool_bytes, "peer " + offer->peer, [&](void* dst, uint64_t size) {
        return options_.peers->Pull(*offer, dst, size, cancel, [&](uint64_t done, uint64_t total) {
          if (progress) {
            progress("fetch", static_cast<int64_t>(done), static_cast<int64_t>(total));
          }
        });
      });
  if (result.ok()) {
    const double ms = MsSince(t0);
    spdlog::info("fetched pool {} ({} bytes) from {} in {:.1f} ms ({:.1f} MB/s)", id.substr(0, 16),
                 offer->pool_bytes, offer->peer, ms, ms > 0 ? offer->pool_bytes / (ms * 1e3) : 0.0);
  }
  return finish(std::move(result));
}

StatusOr<PoolExport> PoolManager::ExportForPeer(const std::string& pool_id) const {
  ipc::UniqueFd fd;
  PoolExport out;
  uint64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    POLYKV_ASSIGN_OR_RETURN(std::string id, ResolvePoolIdLocked(pool_id));
    const Pool& pool = pools_.at(id);
    if (!pool.region) {
      if (!pool.arena) {
        return absl::InternalError(absl::StrCat("pool ", id.substr(0, 16), " holds no memory"));
      }
      // A pool in GPU memory: staged through host memory (the requester publishes it on its
      // own backend, CopyFromHost for a CUDA one).
      try {
        out.staging.resize(pool.memory.size);
      } catch (const std::bad_alloc&) {
        return absl::ResourceExhaustedError(absl::StrCat("no host memory to stage pool ",
                                                         id.substr(0, 16), " (", pool.memory.size,
                                                         " bytes) for a peer"));
      }
      POLYKV_RETURN_IF_ERROR(pool.arena->CopyToHost(0, out.staging.data(), pool.memory.size));
      out.info = InfoLocked(pool);
      return out;
    }
    const int dup = fcntl(pool.region->fd(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
      return absl::InternalError(absl::StrCat("dup of pool memfd: ", std::strerror(errno)));
    fd = ipc::UniqueFd(dup);
    size = pool.region->size();
    out.info = InfoLocked(pool);
  }
  POLYKV_ASSIGN_OR_RETURN(ipc::SealedRegion map, ipc::SealedRegion::MapSealed(std::move(fd), size));
  out.map.emplace(std::move(map));
  return out;
}

uint64_t PoolManager::replicated_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return replicated_;
}

int PoolManager::PreloadPersisted() {
  if (!options_.store) return 0;
  std::vector<ipc::PoolFileManifest> all = options_.store->List();
  int n = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    auto r = RestorePersisted(it->info.id);
    if (r.ok()) {
      ++n;
    } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
      spdlog::warn("preload stops at the memory cap: {}", std::string(r.status().message()));
      break;
    }
  }
  return n;
}

uint64_t PoolManager::restored_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restored_;
}

std::map<std::string, uint32_t> PoolManager::AgentsByPool() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::set<uint32_t>> pids;
  const auto now = Clock::now();
  for (const auto& [lid, lease] : leases_) {
    if (lease.expiry->first > now) pids[lease.pool_id].insert(lease.client_pid);
  }
  std::map<std::string, uint32_t> out;
  for (const auto& [id, pool] : pools_) {
    auto it = pids.find(id);
    out[id] = it == pids.end() ? 0 : static_cast<uint32_t>(it->second.size());
  }
  return out;
}

}  // namespace polykv::daemon

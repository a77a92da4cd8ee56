// PoolManager's admission of a create (see pool_manager.h): the codec (or the parent's), the
// tokens, the pool parameters and content address, then single flight (a create of the same
// content joins the one in progress) and a restore from the state folder or a Build.
#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "pool_manager_internal.h"

namespace polykv::daemon {

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
  POLYKV_RETURN_IF_ERROR(CreateCodec(request, chain.get(), &codec, &key_scale));
  const std::string model_name =
      parent != nullptr && request.model.empty() ? parent->model : request.model;
  POLYKV_ASSIGN_OR_RETURN(OpenedModel opened, OpenModel(model_name, who));
  POLYKV_ASSIGN_OR_RETURN(std::shared_ptr<ModelEntry> entry,
                          GetModel(std::move(opened), model_name, progress));
  model::LlamaModel& m = *entry->model;
  if (parent != nullptr && m.fingerprint() != parent->model_fingerprint) {
    return absl::InvalidArgumentError(
        absl::StrCat("model \"", ipc::Abbreviate(model_name, 256), "\" (fingerprint ",
                     m.fingerprint().substr(0, 16), ") is not the model parent pool ",
                     parent->id.substr(0, 16), " was prefilled with (", parent->model,
                     ", fingerprint ", parent->model_fingerprint.substr(0, 16), ")"));
  }
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                          CreateTokens(request, m, chain.get(), progress));
  POLYKV_ASSIGN_OR_RETURN(
      ipc::PoolParams params,
      CreateParams(m, codec, key_scale, request.norm_correction, chain.get(), ids.size()));
  const std::string pool_id =
      ComputePoolId(params.model_fingerprint, params.tokenizer_fingerprint, params, ids);

  // Join an existing or in-flight create of the same content.
  std::shared_ptr<InFlight> flight;
  POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::PoolInfo> existing,
                          JoinOrRegisterFlight(pool_id, &flight, cancel));
  if (existing) return CreateResult{*std::move(existing), false};
  StatusOr<CreateResult> result =
      RestoreOrBuild(model_name, entry.get(), pool_id, params, ids, progress, cancel, chain.get());
  FinishFlight(pool_id, flight, result.ok() ? absl::OkStatus() : result.status());
  {
    std::lock_guard<std::mutex> lock(models_mu_);
    entry.reset();
    TrimModelCacheLocked(nullptr);
  }
  return result;
}

Status PoolManager::CreateCodec(const ipc::Request& request, const ParentChain* chain,
                                CodecChoice* codec, kernels::KeyScaleMode* key_scale) const {
  const ipc::PoolInfo* parent = chain ? &chain->infos.back() : nullptr;
  if (parent == nullptr) {
    POLYKV_ASSIGN_OR_RETURN(*codec, ParseCodecName(request.codec));
    POLYKV_ASSIGN_OR_RETURN(*key_scale, ParseKeyScale(request.key_scale));
    return absl::OkStatus();
  }
  if (request.codec.empty()) return absl::OkStatus();
  // Another name for the parent's codec is fine; another codec is not.
  POLYKV_ASSIGN_OR_RETURN(*codec, ParseCodecName(request.codec));
  ipc::PoolParams asked = chain->leaf_params;
  POLYKV_RETURN_IF_ERROR(ipc::ApplyCodecSpec(codec->spec, asked.layers, &asked));
  if (codec->named_bits_only) {  // "k8v3" names no key scale or norm correction
    asked.codec_config.key_scale = chain->leaf_params.codec_config.key_scale;
    asked.codec_config.norm_correction = chain->leaf_params.codec_config.norm_correction;
  }
  if (ipc::PoolCodecLabel(asked) != parent->codec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a child pool takes its parent's codec: parent pool ", parent->id.substr(0, 16), " is ",
        parent->codec, ", the create asks for \"", ipc::Abbreviate(request.codec, 48), "\""));
  }
  return absl::OkStatus();
}

StatusOr<std::vector<int32_t>> PoolManager::CreateTokens(const ipc::Request& request,
                                                         const model::LlamaModel& m,
                                                         const ParentChain* chain,
                                                         const ProgressFn& progress) const {
  const model::ModelConfig& cfg = m.config();
  const int64_t parent_tokens = chain ? static_cast<int64_t>(chain->tokens.size()) : 0;
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
  return ids;
}

StatusOr<ipc::PoolParams> PoolManager::CreateParams(const model::LlamaModel& m,
                                                    const CodecChoice& codec,
                                                    kernels::KeyScaleMode key_scale,
                                                    bool norm_correction, const ParentChain* chain,
                                                    size_t tokens) const {
  const model::ModelConfig& cfg = m.config();
  const model::Tokenizer* tok = m.tokenizer();
  ipc::PoolParams params;
  params.layers = static_cast<uint32_t>(cfg.layers);
  params.kv_heads = static_cast<uint32_t>(cfg.kv_heads);
  params.head_dim = static_cast<uint32_t>(cfg.head_dim);
  params.tokens = tokens;
  if (chain) {
    // The parent's codec parameters: the agents attend to the chain as one prefix.
    params.codec = chain->leaf_params.codec;
    params.codec_config = chain->leaf_params.codec_config;
    params.raw_dtype = chain->leaf_params.raw_dtype;
    params.parent_id = chain->infos.back().id;
    params.parent_tokens = static_cast<uint64_t>(chain->tokens.size());
  } else {
    POLYKV_RETURN_IF_ERROR(ipc::ApplyCodecSpec(codec.spec, params.layers, &params));
    if (codec.named_bits_only) {  // "k8v3" & co.: key scale and norm correction as asked
      params.codec_config.key_scale = key_scale;
      params.codec_config.norm_correction = norm_correction;
    }
    POLYKV_ASSIGN_OR_RETURN(params.raw_dtype, model::KvDType(m));
  }
  params.model_fingerprint = m.fingerprint();
  params.tokenizer_fingerprint = tok != nullptr ? tok->Fingerprint() : "none";
  // Recorded for `pools show` (both follow from the fingerprints, so not part of the id).
  params.architecture = cfg.architecture;
  params.tokenizer_family = tok != nullptr ? tok->family() : "none";
  return params;
}

StatusOr<CreateResult> PoolManager::RestoreOrBuild(
    const std::string& model_name, ModelEntry* entry, const std::string& pool_id,
    const ipc::PoolParams& params, const std::vector<int32_t>& ids, const ProgressFn& progress,
    const std::atomic<bool>* cancel, ParentChain* chain) {
  std::optional<ipc::PoolFileManifest> persisted;
  if (options_.store) persisted = options_.store->Find(pool_id);
  if (persisted && persisted->info.id == pool_id) {
    // The same content was persisted by an earlier daemon: the id covers the model
    // fingerprint, so the loaded model is the one the file was made with.
    progress("publish", 0, 1);
    StatusOr<CreateResult> result = Restore(*persisted);
    if (result.ok()) progress("publish", 1, 1);
    if (result.ok() || result.status().code() == absl::StatusCode::kResourceExhausted ||
        result.status().code() == absl::StatusCode::kCancelled) {
      return result;
    }
    spdlog::warn("pool {}: restoring it from the state folder failed ({}); prefilling",
                 pool_id.substr(0, 16), result.status().ToString());
  }
  return Build(model_name, entry, pool_id, params, ids, progress, cancel, chain);
}

StatusOr<std::optional<ipc::PoolInfo>> PoolManager::JoinOrRegisterFlight(
    const std::string& id, std::shared_ptr<InFlight>* flight, const std::atomic<bool>* cancel) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");
    if (auto it = pools_.find(id); it != pools_.end()) return InfoLocked(it->second);
    auto f = in_flight_.find(id);
    if (f == in_flight_.end()) break;
    std::shared_ptr<InFlight> other = f->second;
    spdlog::info("pool {} joins the create, restore or fetch of it in progress", id.substr(0, 16));
    while (!other->done) {
      other->cv.wait_for(lock, std::chrono::milliseconds(100));
      if (Cancelled(cancel)) return absl::CancelledError("polykvd is shutting down");
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

}  // namespace polykv::daemon

// libpolykv_client: what an attached pool offers (see client.h): its attention and layer
// views (host mappings and CUDA IPC device pointers), token ids, decoded layers, recorded
// fidelity, payload verification and lease state.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client_device.h"
#include "client_internal.h"
#include "polykv/client.h"

namespace {

using polykv::Status;
using polykv::StatusOr;
using polykv::client::Fail;
using polykv::client::Guarded;
namespace ipc = polykv::ipc;
namespace kernels = polykv::kernels;

// The attached host pool's PrefixView, built from the header parsed at attach.
StatusOr<kernels::PrefixView> HostViewOf(const polykv_pool* pool) {
  if (!pool->reader || pool->map_base == nullptr)
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", pool->info.id, " lives in GPU memory: it has no host view to attend to"));
  return ipc::PrefixViewOf(*pool->reader);
}

// The attached cuda pool's PrefixView: device pointers into the CUDA IPC mapping.
polykv::StatusOr<polykv::kernels::PrefixView> DeviceViewOf(const polykv_pool* pool) {
  if (!pool->reader || !pool->cuda)
    return absl::FailedPreconditionError(
        absl::StrCat("pool ", pool->info.id,
                     " lives in host memory: it has no device view (attend to it "
                     "with polykv_pool_attention_view)"));
  return ipc::DevicePrefixViewOf(*pool->reader);
}

polykv_status AttentionViewImpl(const char* fn, const polykv_pool* pool, polykv_attention_view* out,
                                bool device) {
  if (pool == nullptr || out == nullptr)
    return Fail(POLYKV_INVALID_ARGUMENT, absl::StrCat(fn, ": NULL argument"));
  if (out->struct_size != sizeof(polykv_attention_view))
    return Fail(POLYKV_INVALID_ARGUMENT,
                absl::StrCat(fn, ": struct_size ", out->struct_size,
                             " is not sizeof(polykv_attention_view) = ",
                             sizeof(polykv_attention_view), " (use polykv_attention_view_init)"));
  return Guarded(fn, [&]() -> Status {
    POLYKV_ASSIGN_OR_RETURN(kernels::PrefixView v, device ? DeviceViewOf(pool) : HostViewOf(pool));
    const ipc::PoolParams& p = pool->reader->params();
    *out = polykv_attention_view_init();
    out->codec = static_cast<uint32_t>(v.codec);
    out->layers = static_cast<uint32_t>(v.layers.size());
    out->kv_heads = static_cast<uint32_t>(v.kv_heads);
    out->head_dim = static_cast<uint32_t>(v.head_dim);
    out->tokens = static_cast<uint64_t>(v.tokens);
    out->parent_tokens = p.parent_tokens;
    out->raw_dtype = static_cast<polykv_dtype>(v.raw_dtype);
    out->key_bits = v.config.key_bits;
    out->value_bits = v.config.value_bits;
    out->key_scale = static_cast<int32_t>(v.config.key_scale);
    out->norm_correction = v.config.norm_correction ? 1 : 0;
    out->norm_dtype = static_cast<polykv_dtype>(v.config.norm_dtype);
    out->rotation_seed = v.config.rotation_seed;
    return Status();
  });
}

polykv_status LayerViewImpl(const char* fn, const polykv_pool* pool, uint32_t layer,
                            polykv_layer_view* out, bool device) {
  if (pool == nullptr || out == nullptr)
    return Fail(POLYKV_INVALID_ARGUMENT, absl::StrCat(fn, ": NULL argument"));
  if (out->struct_size != sizeof(polykv_layer_view))
    return Fail(POLYKV_INVALID_ARGUMENT,
                absl::StrCat(fn, ": struct_size ", out->struct_size,
                             " is not sizeof(polykv_layer_view) = ", sizeof(polykv_layer_view),
                             " (use polykv_layer_view_init)"));
  return Guarded(fn, [&]() -> Status {
    POLYKV_ASSIGN_OR_RETURN(kernels::PrefixView v, device ? DeviceViewOf(pool) : HostViewOf(pool));
    if (layer >= v.layers.size())
      return absl::InvalidArgumentError(absl::StrCat(
          fn, ": layer ", layer, " is not below the pool's ", v.layers.size(), " layers"));
    const kernels::PrefixLayer& l = v.layers[layer];
    *out = polykv_layer_view_init();
    out->value_bits = v.ValueBitsOf(layer);
    out->k = l.k;
    out->k_scales = l.k_scales;
    out->v = l.v;
    out->v_norms = l.v_norms;
    return Status();
  });
}

}  // namespace

extern "C" {

polykv_status polykv_pool_attention_view(const polykv_pool* pool, polykv_attention_view* out) {
  return AttentionViewImpl("polykv_pool_attention_view", pool, out, false);
}

polykv_status polykv_pool_layer_view(const polykv_pool* pool, uint32_t layer,
                                     polykv_layer_view* out) {
  return LayerViewImpl("polykv_pool_layer_view", pool, layer, out, false);
}

polykv_status polykv_pool_device_attention_view(const polykv_pool* pool,
                                                polykv_attention_view* out) {
  return AttentionViewImpl("polykv_pool_device_attention_view", pool, out, true);
}

polykv_status polykv_pool_device_layer_view(const polykv_pool* pool, uint32_t layer,
                                            polykv_layer_view* out) {
  return LayerViewImpl("polykv_pool_device_layer_view", pool, layer, out, true);
}

polykv_status polykv_pool_cuda_device(const polykv_pool* pool, int* cuda_device) {
  if (pool == nullptr || cuda_device == nullptr)
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_cuda_device: NULL argument");
  *cuda_device = pool->cuda ? pool->cuda->device() : -1;
  return POLYKV_OK;
}

size_t polykv_pool_layer_elements(const polykv_pool* pool) {
  if (pool == nullptr || !pool->reader) return 0;
  const ipc::PoolParams& p = pool->reader->params();
  return size_t{p.kv_heads} * p.tokens * p.head_dim;
}

polykv_status polykv_pool_token_ids(const polykv_pool* pool, int32_t* ids, size_t capacity) {
  if (pool == nullptr) return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_token_ids: pool is NULL");
  if (ids == nullptr && capacity > 0) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_token_ids: ids is NULL but capacity > 0");
  }
  return Guarded("polykv_pool_token_ids", [&]() -> Status {
    std::vector<int32_t> all = pool->reader->TokenIds();
    std::copy_n(all.begin(), std::min(capacity, all.size()), ids);
    return Status();
  });
}

polykv_status polykv_decode_layer(const polykv_pool* pool, uint32_t layer, void* k_out, void* v_out,
                                  polykv_dtype dtype) {
  if (pool == nullptr) return Fail(POLYKV_INVALID_ARGUMENT, "polykv_decode_layer: pool is NULL");
  if (k_out == nullptr || v_out == nullptr) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_decode_layer: k_out or v_out is NULL");
  }
  if (dtype != POLYKV_DTYPE_F32 && dtype != POLYKV_DTYPE_F16 && dtype != POLYKV_DTYPE_BF16) {
    return Fail(POLYKV_INVALID_ARGUMENT,
                absl::StrCat("polykv_decode_layer: unknown dtype ", static_cast<int>(dtype)));
  }
  const uint32_t layers = pool->reader->params().layers;
  if (layer >= layers) {
    return Fail(POLYKV_OUT_OF_RANGE,
                absl::StrCat("polykv_decode_layer: layer ", layer, " out of range: pool ",
                             pool->info.id, " has ", layers, " layers"));
  }
  auto [code, message] = pool->LeaseState();
  if (code != POLYKV_OK) return Fail(code, message);
  return Guarded("polykv_decode_layer", [&]() -> Status {
    const auto out_dtype = static_cast<polykv::kernels::DType>(dtype);
    if (pool->cuda) {
      POLYKV_RETURN_IF_ERROR(polykv::client::DecodeDeviceLayerToHost(
          *pool->reader, pool->cuda->device(), layer, k_out, v_out, out_dtype));
    } else {
      POLYKV_RETURN_IF_ERROR(pool->reader->DecodeLayer(layer, k_out, v_out, out_dtype));
    }
    // The lease may have been lost while decoding: never hand out possibly stale data.
    auto [after, why] = pool->LeaseState();
    if (after != POLYKV_OK) return Status(static_cast<absl::StatusCode>(after), why);
    return Status();
  });
}

polykv_status polykv_pool_fidelity(const polykv_pool* pool, float* key_rel_mse,
                                   float* value_rel_mse, size_t capacity, size_t* layers) {
  if (pool == nullptr || layers == nullptr)
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_fidelity: pool or layers is NULL");
  if (capacity > 0 && (key_rel_mse == nullptr || value_rel_mse == nullptr))
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_fidelity: output arrays are NULL");
  return Guarded("polykv_pool_fidelity", [&]() -> Status {
    const std::vector<ipc::LayerFidelity> f = pool->reader->RecordedFidelity();
    *layers = f.size();
    for (size_t l = 0; l < f.size() && l < capacity; ++l) {
      key_rel_mse[l] = static_cast<float>(f[l].key_rel_mse);
      value_rel_mse[l] = static_cast<float>(f[l].value_rel_mse);
    }
    return Status();
  });
}

polykv_status polykv_pool_verify(const polykv_pool* pool) {
  if (pool == nullptr) return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_verify: pool is NULL");
  return Guarded("polykv_pool_verify", [&]() -> Status {
    Status s = pool->reader->VerifyPayload();
    if (!s.ok()) {
      return Status(s.code(), absl::StrCat("pool ", pool->info.id, ": ", s.message()));
    }
    return s;
  });
}

polykv_status polykv_pool_lease_status(const polykv_pool* pool) {
  if (pool == nullptr)
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_lease_status: pool is NULL");
  auto [code, message] = pool->LeaseState();
  if (code != POLYKV_OK) return Fail(code, message);
  return POLYKV_OK;
}

}  // extern "C"

// A prefill's K/V as plain buffers, a model's K/V dtype, and a prefill after a read-only
// prefix (polykv/model/prefill.h).
#include "polykv/model/prefill.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "polykv/kernels/dtype_convert.h"
#include "polykv/model/llama.h"

namespace polykv::model {
namespace {

// f32 values converted to `dtype`'s bytes (f32: copied as they are).
std::vector<uint8_t> Convert(const std::vector<float>& x, kernels::DType dtype) {
  std::vector<uint8_t> out(x.size() * kernels::DTypeSize(dtype));
  switch (dtype) {
    case kernels::DType::kF32:
      std::copy_n(reinterpret_cast<const uint8_t*>(x.data()), out.size(), out.begin());
      break;
    case kernels::DType::kF16:
    case kernels::DType::kBF16: {
      auto* o = reinterpret_cast<uint16_t*>(out.data());
      const bool bf16 = dtype == kernels::DType::kBF16;
      for (size_t i = 0; i < x.size(); ++i)
        o[i] = bf16 ? kernels::dtype::FloatToBf16(x[i]) : kernels::dtype::FloatToF16(x[i]);
      break;
    }
  }
  return out;
}

}  // namespace

size_t PrefilledLayerCount(const PrefillResult& prefill) {
  return prefill.device_kv ? prefill.device_k.size() : prefill.k.size();
}

StatusOr<PrefilledLayer> ExportPrefilledLayer(const PrefillResult& prefill, size_t layer,
                                              bool to_host, std::optional<kernels::DType> dtype) {
  if (prefill.device_kv) {  // K/V left on the device by a GPU prefill: handed over in place
    if (layer >= prefill.device_k.size() || layer >= prefill.device_v.size())
      return absl::OutOfRangeError(
          absl::StrCat("prefill layer ", layer, " of ", prefill.device_k.size(), " device layers"));
    if (to_host)
      return absl::FailedPreconditionError(
          "the prefill's K/V are in device memory: write the pool on the device");
    if (dtype.has_value() && *dtype != kernels::DType::kF32)
      return absl::UnimplementedError("a device prefill's K/V are exported as f32 only");
    PrefilledLayer out;
    out.dtype_ = kernels::DType::kF32;
    out.device_ = kernels::Device::kCuda;
    out.elements_ = prefill.device_layer_elements;
    out.k_ = prefill.device_k[layer];
    out.v_ = prefill.device_v[layer];
    out.keep_ = prefill.device_kv;
    return out;
  }
  if (layer >= prefill.k.size() || layer >= prefill.v.size()) {
    return absl::OutOfRangeError(absl::StrCat("prefill layer ", layer, " of ", prefill.k.size(),
                                              " K / ", prefill.v.size(), " V layers"));
  }
  const std::vector<float>& k = prefill.k[layer];
  const std::vector<float>& v = prefill.v[layer];
  if (k.size() != v.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill layer ", layer, ": K has ", k.size(), " elements, V ", v.size()));
  }
  const kernels::DType out_dtype = dtype.value_or(kernels::DType::kF32);
  try {
    auto kept = std::make_shared<std::pair<std::vector<uint8_t>, std::vector<uint8_t>>>(
        Convert(k, out_dtype), Convert(v, out_dtype));
    PrefilledLayer out;
    out.dtype_ = out_dtype;
    out.device_ = kernels::Device::kCpu;
    out.elements_ = static_cast<int64_t>(k.size());
    out.k_ = kept->first.data();
    out.v_ = kept->second.data();
    out.keep_ = std::move(kept);
    return out;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prefill layer ", layer, ": out of memory copying ", k.size(), " values"));
  }
}

StatusOr<kernels::DType> KvDType(const LlamaModel& m) {
  const kernels::DType d = m.dtype();
  switch (d) {
    case kernels::DType::kF32:
    case kernels::DType::kF16:
    case kernels::DType::kBF16:
      return d;
  }
  return absl::UnimplementedError(
      absl::StrCat("KV dtype ", static_cast<int>(d), " is not supported by pools"));
}

StatusOr<std::shared_ptr<KvPrefix>> MakeRawPrefix(const ModelConfig& config, int64_t tokens,
                                                  std::vector<std::vector<float>> k,
                                                  std::vector<std::vector<float>> v) {
  const size_t want = static_cast<size_t>(int64_t{config.kv_heads} * tokens * config.head_dim);
  if (k.size() != static_cast<size_t>(config.layers) || v.size() != k.size())
    return absl::InvalidArgumentError(absl::StrCat("raw prefix: ", k.size(), " K and ", v.size(),
                                                   " V layers for a model of ", config.layers));
  for (size_t l = 0; l < k.size(); ++l)
    if (k[l].size() != want || v[l].size() != want)
      return absl::InvalidArgumentError(
          absl::StrCat("raw prefix layer ", l, ": ", k[l].size(), " K and ", v[l].size(),
                       " V values, [kv_heads][tokens][head_dim] needs ", want));
  struct Owner {
    std::vector<std::vector<float>> k, v;
  };
  auto owner = std::make_shared<Owner>();
  owner->k = std::move(k);
  owner->v = std::move(v);
  auto prefix = std::make_shared<KvPrefix>();
  prefix->view.kv_heads = config.kv_heads;
  prefix->view.head_dim = config.head_dim;
  prefix->view.tokens = tokens;
  prefix->view.codec = kernels::PrefixCodec::kRaw;
  prefix->view.raw_dtype = kernels::DType::kF32;
  for (size_t l = 0; l < owner->k.size(); ++l)
    prefix->view.layers.push_back(
        kernels::PrefixLayer{owner->k[l].data(), nullptr, owner->v[l].data(), nullptr});
  prefix->owner = std::move(owner);
  return prefix;
}

StatusOr<PrefillResult> PrefillAfterPrefix(LlamaModel& m,
                                           const std::vector<kernels::PrefixView>& views,
                                           const std::vector<int32_t>& prefix_tokens,
                                           const std::vector<int32_t>& ids, int64_t chunk,
                                           const std::function<void(int64_t, int64_t)>& on_chunk) {
  if (views.empty()) return absl::InvalidArgumentError("a prefill after a prefix needs its views");
  auto prefix = std::make_shared<KvPrefix>();
  prefix->view = views.front();
  prefix->tail.assign(views.begin() + 1, views.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  auto cache = m.NewCacheWithPrefix(std::move(prefix), prefix_tokens, n);
  if (!cache.ok()) {
    return Status(cache.status().code(),
                  absl::StrCat("a child pool is prefilled attending to its parent in place: ",
                               cache.status().message()));
  }
  chunk = std::max<int64_t>(chunk, 1);
  const absl::Span<const int32_t> all(ids);
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t len = std::min(chunk, n - off);
    auto logits = m.Forward(all.subspan(off, len), *cache, /*all_logits=*/false);
    if (!logits.ok()) return logits.status();
    on_chunk(off + len, n);
  }
  // The suffix holds exactly n positions when its capacity was n (no growth): move it;
  // otherwise pack [kv_heads][n][head_dim] out of [kv_heads][capacity][head_dim].
  PrefillResult out;
  out.tokens = n;
  const int64_t cap = cache->capacity, kvh = m.config().kv_heads, hd = m.config().head_dim;
  try {
    for (size_t l = 0; l < cache->k.size(); ++l) {
      for (auto [from, to] : {std::pair{&cache->k[l], &out.k}, std::pair{&cache->v[l], &out.v}}) {
        if (cap == n) {
          to->push_back(std::move(*from));
          continue;
        }
        std::vector<float> packed(static_cast<size_t>(kvh * n * hd));
        for (int64_t h = 0; h < kvh; ++h)
          std::copy_n(from->begin() + h * cap * hd, n * hd, packed.begin() + h * n * hd);
        to->push_back(std::move(packed));
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("a child pool's K/V: out of memory");
  }
  return out;
}

}  // namespace polykv::model

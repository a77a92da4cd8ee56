// A prefill's K/V as plain buffers, a model's K/V dtype, and a prefill after a read-only
// prefix (polykv/model/prefill.h): the libtorch side of what the daemon and the CLI use.
#include "polykv/model/prefill.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "polykv/model/llama.h"

namespace polykv::model {
namespace {

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

torch::ScalarType ScalarTypeOf(kernels::DType d) {
  switch (d) {
    case kernels::DType::kF16:
      return torch::kFloat16;
    case kernels::DType::kBF16:
      return torch::kBFloat16;
    case kernels::DType::kF32:
      break;
  }
  return torch::kFloat32;
}

}  // namespace

size_t PrefilledLayerCount(const PrefillResult& prefill) { return prefill.k.size(); }

StatusOr<PrefilledLayer> ExportPrefilledLayer(const PrefillResult& prefill, size_t layer,
                                              bool to_host, std::optional<kernels::DType> dtype) {
  if (layer >= prefill.k.size() || layer >= prefill.v.size()) {
    return absl::OutOfRangeError(absl::StrCat("prefill layer ", layer, " of ", prefill.k.size(),
                                              " K / ", prefill.v.size(), " V layers"));
  }
  try {
    torch::Tensor k = prefill.k[layer];
    torch::Tensor v = prefill.v[layer];
    if (k.numel() != v.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefill layer ", layer, ": K has ", k.numel(), " elements, V ", v.numel()));
    }
    if (to_host && k.is_cuda()) {
      k = k.cpu();
      v = v.cpu();
    }
    if (dtype.has_value()) {
      k = k.to(ScalarTypeOf(*dtype));
      v = v.to(ScalarTypeOf(*dtype));
    }
    k = k.contiguous();
    v = v.contiguous();
    PrefilledLayer out;
    POLYKV_ASSIGN_OR_RETURN(out.dtype_, DTypeOf(k.scalar_type()));
    out.device_ = k.is_cuda() ? kernels::Device::kCuda : kernels::Device::kCpu;
    out.elements_ = k.numel();
    out.k_ = k.data_ptr();
    out.v_ = v.data_ptr();
    out.keep_ =
        std::make_shared<std::pair<torch::Tensor, torch::Tensor>>(std::move(k), std::move(v));
    return out;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("prefill layer ", layer, ": ", e.what()));
  }
}

StatusOr<kernels::DType> KvDType(const LlamaModel& m) { return DTypeOf(m.dtype()); }

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
  try {
    PrefillResult out;
    for (size_t l = 0; l < cache->k.size(); ++l) {
      out.k.push_back(cache->k[l].narrow(1, 0, n).contiguous());
      out.v.push_back(cache->v[l].narrow(1, 0, n).contiguous());
    }
    return out;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("a child pool's K/V: ", e.what()));
  }
}

}  // namespace polykv::model

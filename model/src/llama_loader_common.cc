// Loader pieces shared by the HF and GGUF paths: config checks, mapped weight views, SHA-256.
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "llama_internal.h"

namespace polykv::model::internal {

Status ValidateConfig(const ModelConfig& c, const std::string& source) {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  if (c.layers <= 0) return bad(absl::StrCat("layer count must be > 0, got ", c.layers));
  if (c.hidden <= 0) return bad(absl::StrCat("hidden size must be > 0, got ", c.hidden));
  if (c.heads <= 0) return bad(absl::StrCat("attention head count must be > 0, got ", c.heads));
  if (c.kv_heads <= 0 || c.heads % c.kv_heads != 0)
    return bad(absl::StrCat("KV head count ", c.kv_heads, " must be > 0 and divide the head count ",
                            c.heads));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    return bad(absl::StrCat("head_dim must be a positive even number, got ", c.head_dim));
  if (c.ffn <= 0) return bad(absl::StrCat("intermediate (FFN) size must be > 0, got ", c.ffn));
  if (c.vocab <= 0) return bad(absl::StrCat("vocab size must be > 0, got ", c.vocab));
  if (!(c.rope_theta > 0)) return bad(absl::StrCat("rope theta must be > 0, got ", c.rope_theta));
  if (!(c.rms_eps > 0)) return bad(absl::StrCat("RMS norm epsilon must be > 0, got ", c.rms_eps));
  if (!(c.rope_linear_scale > 0))
    return bad(absl::StrCat("rope scaling factor must be > 0, got ", c.rope_linear_scale));
  const RopeScaling& rs = c.rope_scaling;
  const std::string rt = absl::StrCat("rope scaling '", RopeScalingName(rs.type), "': ");
  switch (rs.type) {
    case RopeScalingType::kNone:
    case RopeScalingType::kLinear:
      break;
    case RopeScalingType::kLlama3:
      if (!(rs.factor > 0)) return bad(absl::StrCat(rt, "factor must be > 0, got ", rs.factor));
      if (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor))
        return bad(absl::StrCat(rt, "need 0 < low_freq_factor < high_freq_factor, got ",
                                rs.low_freq_factor, " and ", rs.high_freq_factor));
      if (rs.original_max_positions <= 0)
        return bad(absl::StrCat(rt, "original_max_position_embeddings must be > 0, got ",
                                rs.original_max_positions));
      break;
    case RopeScalingType::kYarn:
      if (!(rs.factor >= 1)) return bad(absl::StrCat(rt, "factor must be >= 1, got ", rs.factor));
      if (rs.original_max_positions <= 0)
        return bad(absl::StrCat(rt, "original context length must be > 0, got ",
                                rs.original_max_positions));
      if (!(rs.beta_fast > 0) || !(rs.beta_slow > 0))
        return bad(absl::StrCat(rt, "beta_fast and beta_slow must be > 0, got ", rs.beta_fast,
                                " and ", rs.beta_slow));
      if (!(rs.attention_factor > 0) || !std::isfinite(rs.attention_factor))
        return bad(absl::StrCat(rt, "attention factor must be > 0, got ", rs.attention_factor));
      break;
    case RopeScalingType::kFreqFactors:
      if (static_cast<int64_t>(rs.freq_factors.size()) != c.head_dim / 2)
        return bad(absl::StrCat(rt, rs.freq_factors.size(), " factors for head_dim ", c.head_dim,
                                " (need head_dim / 2)"));
      for (float f : rs.freq_factors)
        if (!(f > 0) || !std::isfinite(f))
          return bad(absl::StrCat(rt, "every factor must be finite and > 0, got ", f));
      break;
  }
  if (c.sliding_window < 0)
    return bad(absl::StrCat("sliding window must be >= 0, got ", c.sliding_window));
  return absl::OkStatus();
}

namespace {

StatusOr<MappedMatrix> MapMatrix(WeightReader& reader, const std::string& role, int layer,
                                 int64_t rows, int64_t cols, int32_t heads) {
  POLYKV_ASSIGN_OR_RETURN(RawTensor t, reader.GetRaw(role, layer, {rows, cols}));
  const std::string where = layer < 0 ? role : absl::StrCat("layer ", layer, " ", role);
  if (!kernels::IsSupportedWeightType(t.type))
    return absl::UnimplementedError(
        absl::StrCat("tensor ", where, ": type ", t.type, " has no matrix kernels in PolyKV"));
  auto view = kernels::MakeWeightView(static_cast<kernels::WeightType>(t.type), t.data, t.bytes,
                                      rows, cols);
  if (!view.ok())
    return Status(view.status().code(),
                  absl::StrCat("tensor ", where, ": ", view.status().message()));
  MappedMatrix m;
  m.w = *view;
  m.interleaved_heads = t.interleaved_qk ? heads : 0;
  return m;
}

// A norm or bias vector of n values as f32: the mapping itself when stored as aligned f32,
// else a small private copy.
StatusOr<const float*> MapVector(WeightReader& reader, const std::string& role, int layer,
                                 int64_t n, MappedWeights* out) {
  POLYKV_ASSIGN_OR_RETURN(RawTensor t, reader.GetRaw(role, layer, {n}));
  if (t.type == static_cast<uint32_t>(kernels::WeightType::kF32) &&
      reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
    if (t.bytes < static_cast<uint64_t>(n) * 4)
      return absl::DataLossError(absl::StrCat("tensor ", role, ": data shorter than ", n, " f32"));
    return static_cast<const float*>(t.data);
  }
  std::vector<float> f(static_cast<size_t>(n));
  Status s = kernels::DequantizeValues(static_cast<kernels::WeightType>(t.type), t.data, t.bytes, n,
                                       f.data());
  if (!s.ok())
    return Status(
        s.code(),
        absl::StrCat("tensor ", layer < 0 ? role : absl::StrCat("layer ", layer, " ", role), ": ",
                     s.message()));
  out->converted.push_back(std::move(f));
  return out->converted.back().data();
}

}  // namespace

Status BuildMappedWeights(const ModelConfig& c, WeightReader& reader, MappedWeights* out) {
  const int64_t h = c.hidden, q_rows = int64_t{c.heads} * c.head_dim,
                kv_rows = int64_t{c.kv_heads} * c.head_dim;
  out->converted.reserve(static_cast<size_t>(6 * c.layers + 1));  // pointers stay valid
  POLYKV_ASSIGN_OR_RETURN(out->embed, MapMatrix(reader, "embed", -1, c.vocab, h, 0));
  out->layers.assign(static_cast<size_t>(c.layers), MappedLayer{});
  for (int l = 0; l < c.layers; ++l) {
    MappedLayer& lw = out->layers[static_cast<size_t>(l)];
    POLYKV_ASSIGN_OR_RETURN(lw.attn_norm, MapVector(reader, "attn_norm", l, h, out));
    POLYKV_ASSIGN_OR_RETURN(lw.q, MapMatrix(reader, "q", l, q_rows, h, c.heads));
    POLYKV_ASSIGN_OR_RETURN(lw.k, MapMatrix(reader, "k", l, kv_rows, h, c.kv_heads));
    POLYKV_ASSIGN_OR_RETURN(lw.v, MapMatrix(reader, "v", l, kv_rows, h, 0));
    if (c.qkv_bias) {
      POLYKV_ASSIGN_OR_RETURN(lw.bq, MapVector(reader, "q_bias", l, q_rows, out));
      POLYKV_ASSIGN_OR_RETURN(lw.bk, MapVector(reader, "k_bias", l, kv_rows, out));
      POLYKV_ASSIGN_OR_RETURN(lw.bv, MapVector(reader, "v_bias", l, kv_rows, out));
    }
    POLYKV_ASSIGN_OR_RETURN(lw.o, MapMatrix(reader, "o", l, h, q_rows, 0));
    if (c.o_bias) {
      POLYKV_ASSIGN_OR_RETURN(lw.bo, MapVector(reader, "o_bias", l, h, out));
    }
    POLYKV_ASSIGN_OR_RETURN(lw.ffn_norm, MapVector(reader, "ffn_norm", l, h, out));
    POLYKV_ASSIGN_OR_RETURN(lw.gate, MapMatrix(reader, "gate", l, c.ffn, h, 0));
    POLYKV_ASSIGN_OR_RETURN(lw.up, MapMatrix(reader, "up", l, c.ffn, h, 0));
    POLYKV_ASSIGN_OR_RETURN(lw.down, MapMatrix(reader, "down", l, h, c.ffn, 0));
  }
  POLYKV_ASSIGN_OR_RETURN(out->norm, MapVector(reader, "norm", -1, h, out));
  if (c.tied_embeddings) {
    out->lm_head = out->embed;
  } else {
    POLYKV_ASSIGN_OR_RETURN(out->lm_head, MapMatrix(reader, "output", -1, c.vocab, h, 0));
  }
  out->files = reader.Mappings();
  return absl::OkStatus();
}

namespace {

std::string HexOf(const unsigned char* md, unsigned len) {
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned i = 0; i < len; ++i) {
    hex.push_back(kHex[md[i] >> 4]);
    hex.push_back(kHex[md[i] & 15]);
  }
  return hex;
}

// The fingerprint cache folder ("" = off).
std::string FingerprintCacheDir() {
  return UserCacheDir("POLYKV_FINGERPRINT_CACHE", "fingerprints");
}

// The cache entry's name for these files as they are now (see Sha256OfFiles), or "" when a
// file cannot be stat'ed.
std::string FingerprintCacheKey(const std::string& prefix, const std::vector<std::string>& paths) {
  std::string id = absl::StrCat("polykv-fingerprint-1\n", prefix.size(), "\n", prefix);
  for (const std::string& p : paths) {
    char* real = realpath(p.c_str(), nullptr);
    struct stat st;
    const bool ok = real != nullptr && stat(real, &st) == 0;
    if (ok) {
      absl::StrAppend(&id, "\n", real, "\n", st.st_dev, " ", st.st_ino, " ", st.st_size, " ",
                      st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, " ", st.st_ctim.tv_sec, ".",
                      st.st_ctim.tv_nsec);
    }
    std::free(real);
    if (!ok) return std::string();
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(id.data(), id.size(), md, &len, EVP_sha256(), nullptr) != 1) return std::string();
  return HexOf(md, len);
}

bool IsHexDigest(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

StatusOr<std::string> HashFiles(const std::string& prefix, const std::vector<std::string>& paths) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    return absl::InternalError("SHA-256 init failed");
  EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size());
  std::vector<char> buf(1 << 20);
  for (const auto& p : paths) {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(p.c_str(), "rb"), std::fclose);
    if (!f) return absl::NotFoundError(absl::StrCat(p, ": cannot open for hashing"));
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0)
      EVP_DigestUpdate(ctx.get(), buf.data(), n);
    if (std::ferror(f.get()))
      return absl::DataLossError(absl::StrCat(p, ": read error while hashing"));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return absl::InternalError("SHA-256 failed");
  return HexOf(md, len);
}

}  // namespace

std::string UserCacheDir(const char* env, const char* name) {
  if (const char* e = std::getenv(env); e != nullptr && *e != '\0')
    return std::string_view(e) == "0" ? std::string() : std::string(e);
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/')
    return absl::StrCat(x, "/polykv/", name);
  if (const char* h = std::getenv("HOME"); h != nullptr && *h == '/')
    return absl::StrCat(h, "/.cache/polykv/", name);
  return std::string();
}

StatusOr<std::string> Sha256OfFiles(const std::string& prefix,
                                    const std::vector<std::string>& paths) {
  const std::string dir = FingerprintCacheDir();
  const std::string key = dir.empty() ? std::string() : FingerprintCacheKey(prefix, paths);
  const std::string entry = key.empty() ? std::string() : absl::StrCat(dir, "/", key);
  if (!entry.empty()) {
    std::ifstream in(entry);
    std::string cached;
    if (in >> cached && IsHexDigest(cached)) return cached;
  }
  POLYKV_ASSIGN_OR_RETURN(std::string digest, HashFiles(prefix, paths));
  if (!entry.empty()) {
    // Best effort, atomically: a temporary file in the same folder renamed over the entry.
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string tmp = absl::StrCat(entry, ".tmp.", getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << digest << "\n";
      if (!out.flush()) ec = std::make_error_code(std::errc::io_error);
    }
    if (ec || std::rename(tmp.c_str(), entry.c_str()) != 0) std::remove(tmp.c_str());
  }
  return digest;
}

Status StatusFromException(const std::exception& e, const std::string& context) {
  const std::string msg = e.what();
  const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                   msg.find("out of memory") != std::string::npos ||
                   msg.find("can't allocate") != std::string::npos;
  // Some messages carry a long backtrace after the first line: keep the first.
  std::string first = msg.substr(0, msg.find('\n'));
  if (oom) return absl::ResourceExhaustedError(absl::StrCat(context, ": out of memory: ", first));
  return absl::InternalError(absl::StrCat(context, ": ", first));
}

Status CheckSamplingOptions(const SamplingOptions& o, const char* context) {
  if (o.max_new_tokens < 0)
    return absl::InvalidArgumentError(
        absl::StrCat(context, "max_new_tokens must be >= 0, got ", o.max_new_tokens));
  if (!o.greedy) {
    if (!(o.temperature > 0) || !std::isfinite(o.temperature))
      return absl::InvalidArgumentError(
          absl::StrCat(context, "temperature must be > 0, got ", o.temperature));
    if (!(o.top_p > 0 && o.top_p <= 1))
      return absl::InvalidArgumentError(
          absl::StrCat(context, "top_p must be in (0, 1], got ", o.top_p));
  }
  return absl::OkStatus();
}

StatusOr<Logits> NewLogits(int64_t rows, int32_t vocab, const std::string& context) {
  Logits logits;
  logits.rows = rows;
  logits.vocab = vocab;
  try {
    logits.values.resize(static_cast<size_t>(rows * vocab));
  } catch (const std::exception& e) {
    return StatusFromException(e, context);
  }
  return logits;
}

}  // namespace polykv::model::internal

// GGUF (v2/v3) reader: read-only mmap, bounds-checked parse of metadata and tensor table.
#include "polykv/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "polykv/kernels/ggml_types.h"

namespace polykv::model {
namespace {

// GGUF metadata value types (gguf.md).
enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
constexpr uint32_t kNumValueTypes = 13;
constexpr uint32_t kMaxDims = 4;     // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;  // nested arrays deeper than this are rejected
constexpr uint64_t kDefaultAlignment = 32;

// Bounds-checked little-endian reader over the mapping.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status Need(uint64_t n, const std::string& what) const {
    if (n > size_ - pos_) {
      return absl::DataLossError(absl::StrCat("GGUF truncated: ", what, " needs ", n,
                                              " bytes at offset ", pos_, " but only ", size_ - pos_,
                                              " remain"));
    }
    return absl::OkStatus();
  }
  template <typename T>
  StatusOr<T> Read(const std::string& what) {
    POLYKV_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  Status Skip(uint64_t n, const std::string& what) {
    POLYKV_RETURN_IF_ERROR(Need(n, what));
    pos_ += n;
    return absl::OkStatus();
  }
  // A gguf_string: u64 length + bytes.
  StatusOr<std::string_view> ReadString(const std::string& what) {
    POLYKV_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what + " length"));
    if (len > size_ - pos_) {
      return absl::DataLossError(absl::StrCat("GGUF truncated or corrupt: ", what, " length ", len,
                                              " at offset ", pos_ - 8, " exceeds the remaining ",
                                              size_ - pos_, " bytes of the file"));
    }
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

struct MetaValue {
  uint32_t type = 0;
  // Scalars.
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  // Arrays: element type, count and byte offset of the first element in the mapping.
  uint32_t elem_type = 0;
  uint64_t count = 0;
  uint64_t data_offset = 0;
};

/// Reads an integer metadata value of type T into all three views of `v` (u, i and f).
template <typename T>
Status ReadNumber(Reader& r, const std::string& what, MetaValue* v) {
  POLYKV_ASSIGN_OR_RETURN(T x, r.Read<T>(what));
  v->u = static_cast<uint64_t>(x);
  v->i = static_cast<int64_t>(x);
  v->f = static_cast<double>(x);
  return absl::OkStatus();
}

// Element `k` of an array of T at `p`, as a double.
template <typename T>
double LoadAsDouble(const uint8_t* p, uint64_t k) {
  T y;
  std::memcpy(&y, p + sizeof(T) * k, sizeof(T));
  return static_cast<double>(y);
}

// The value types' table, indexed by ValueType: name, scalar size (0 for string and array),
// the reader of one array element of a numeric type (nullptr for string and array) and, for
// the integer types only, the reader of a metadata value.
struct ValueTypeInfo {
  const char* name;
  uint64_t size;
  double (*load)(const uint8_t* p, uint64_t k);
  Status (*read_int)(Reader& r, const std::string& what, MetaValue* v);
};
constexpr ValueTypeInfo kValueTypes[kNumValueTypes] = {
    {"u8", 1, LoadAsDouble<uint8_t>, ReadNumber<uint8_t>},
    {"i8", 1, LoadAsDouble<int8_t>, ReadNumber<int8_t>},
    {"u16", 2, LoadAsDouble<uint16_t>, ReadNumber<uint16_t>},
    {"i16", 2, LoadAsDouble<int16_t>, ReadNumber<int16_t>},
    {"u32", 4, LoadAsDouble<uint32_t>, ReadNumber<uint32_t>},
    {"i32", 4, LoadAsDouble<int32_t>, ReadNumber<int32_t>},
    {"f32", 4, LoadAsDouble<float>, nullptr},
    {"bool", 1, LoadAsDouble<uint8_t>, nullptr},
    {"string", 0, nullptr, nullptr},
    {"array", 0, nullptr, nullptr},
    {"u64", 8, LoadAsDouble<uint64_t>, ReadNumber<uint64_t>},
    {"i64", 8, LoadAsDouble<int64_t>, ReadNumber<int64_t>},
    {"f64", 8, LoadAsDouble<double>, nullptr}};

const char* ValueTypeName(uint32_t t) {
  return t < kNumValueTypes ? kValueTypes[t].name : "unknown";
}

// Size of a scalar value type; 0 for string/array/unknown.
uint64_t ScalarSize(uint32_t t) { return t < kNumValueTypes ? kValueTypes[t].size : 0; }

bool IsInt(uint32_t t) { return t < kNumValueTypes && kValueTypes[t].read_int != nullptr; }

bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

struct TypeTraits {
  const char* name;
  int64_t block;   // elements per block; 0 = unknown size
  uint64_t bytes;  // bytes per block
};

// Name and block size of ggml type `t` from the one ggml type table (kernels/ggml_types.h).
TypeTraits Traits(uint32_t t) {
  const kernels::GgmlTypeInfo* g = kernels::FindGgmlType(t);
  if (g == nullptr) return {nullptr, 0, 0};
  return {g->name, g->block_values, static_cast<uint64_t>(g->block_bytes)};
}

}  // namespace

std::string GgmlTypeName(uint32_t type) {
  TypeTraits t = Traits(type);
  return t.name ? std::string(t.name) : absl::StrCat("type ", type);
}

int64_t GgufTensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // validated not to overflow at Open
  return n;
}

StatusOr<uint64_t> GgmlTypeBytes(uint32_t type, int64_t elements) {
  TypeTraits t = Traits(type);
  if (t.block == 0) {
    return absl::UnimplementedError(
        absl::StrCat("ggml type ", GgmlTypeName(type), " (", type, ") is not supported by PolyKV"));
  }
  if (elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative element count ", elements));
  }
  if (elements % t.block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(elements, " elements of ggml type ", t.name,
                                                   " is not a multiple of its block of ", t.block));
  }
  uint64_t bytes;
  if (MulOverflow(static_cast<uint64_t>(elements / t.block), t.bytes, &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(elements, " elements of ggml type ", t.name, " overflow a 64-bit byte count"));
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------
struct GgufFile::Impl {
  std::string path;
  uint32_t version = 0;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  void* map = nullptr;
  uint64_t map_size = 0;
  std::vector<std::string> keys;
  std::unordered_map<std::string, MetaValue> meta;
  std::vector<GgufTensorInfo> tensors;
  std::unordered_map<std::string, size_t> tensor_index;

  ~Impl() {
    if (map != nullptr) munmap(map, map_size);
  }

  Status ValidateValue(Reader& r, uint32_t type, const std::string& what, int depth);
  /// Parses the whole file: header, metadata, alignment, tensor table, data placement.
  Status Parse();
  /// Reads the magic, the version (into `version`) and the two counts, each checked against
  /// what the rest of the file could hold.
  Status ParseHeader(Reader& r, uint64_t* n_tensors, uint64_t* n_kv);
  /// Reads the `n_kv` metadata key/value pairs into `keys` and `meta`.
  Status ParseMetadata(Reader& r, uint64_t n_kv);
  /// Reads one metadata value of `type` (already checked to be a known type).
  StatusOr<MetaValue> ReadMetaValue(Reader& r, uint32_t type, const std::string& what);
  /// The data section alignment: general.alignment (a u32 power of two) or the default.
  StatusOr<uint64_t> Alignment() const;
  /// Reads the `n_tensors` tensor infos into `tensors` / `tensor_index`, offsets relative to
  /// the data section.
  Status ParseTensorInfos(Reader& r, uint64_t n_tensors, uint64_t alignment);
  /// Reads tensor info #k: name, dims, type and (aligned) relative offset.
  StatusOr<GgufTensorInfo> ReadTensorInfo(Reader& r, uint64_t k, uint64_t alignment);
  /// Places the data section after the tensor table (r's position, aligned), checks every
  /// tensor's bytes lie inside the file and makes its offset absolute.
  Status PlaceTensorData(const Reader& r, uint64_t n_tensors, uint64_t alignment);
  const MetaValue* Find(std::string_view key) const {
    auto it = meta.find(std::string(key));
    return it == meta.end() ? nullptr : &it->second;
  }
};

// Validates (and skips) one value of `type` at r's position, recursing into arrays.
Status GgufFile::Impl::ValidateValue(Reader& r, uint32_t type, const std::string& what, int depth) {
  if (type >= kNumValueTypes) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF ", what, " has unknown value type ", type));
  }
  if (type == kString) {
    return r.ReadString(what).status();
  }
  if (type == kArray) {
    if (depth >= kMaxArrayNesting) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF ", what, " nests arrays deeper than ", kMaxArrayNesting));
    }
    POLYKV_ASSIGN_OR_RETURN(uint32_t et, r.Read<uint32_t>(what + " array element type"));
    POLYKV_ASSIGN_OR_RETURN(uint64_t n, r.Read<uint64_t>(what + " array count"));
    if (et >= kNumValueTypes) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF ", what, " array has unknown element type ", et));
    }
    // Minimum bytes per element: scalars their size, strings 8 (length), arrays 12.
    uint64_t min_elem = et == kString ? 8 : et == kArray ? 12 : ScalarSize(et);
    uint64_t min_bytes;
    if (MulOverflow(n, min_elem, &min_bytes) || min_bytes > r.remaining()) {
      return absl::DataLossError(absl::StrCat(
          "GGUF truncated or corrupt: ", what, " array count ", n, " of ", ValueTypeName(et),
          " exceeds the remaining ", r.remaining(), " bytes of the file"));
    }
    if (et != kString && et != kArray) return r.Skip(min_bytes, what);
    for (uint64_t k = 0; k < n; ++k) {
      POLYKV_RETURN_IF_ERROR(ValidateValue(r, et, absl::StrCat(what, "[", k, "]"), depth + 1));
    }
    return absl::OkStatus();
  }
  return r.Skip(ScalarSize(type), what);
}

Status GgufFile::Impl::Parse() {
  Reader r(data, size);
  uint64_t n_tensors = 0, n_kv = 0;
  POLYKV_RETURN_IF_ERROR(ParseHeader(r, &n_tensors, &n_kv));
  POLYKV_RETURN_IF_ERROR(ParseMetadata(r, n_kv));
  POLYKV_ASSIGN_OR_RETURN(uint64_t alignment, Alignment());
  POLYKV_RETURN_IF_ERROR(ParseTensorInfos(r, n_tensors, alignment));
  return PlaceTensorData(r, n_tensors, alignment);
}

Status GgufFile::Impl::ParseHeader(Reader& r, uint64_t* n_tensors, uint64_t* n_kv) {
  POLYKV_ASSIGN_OR_RETURN(uint32_t magic, r.Read<uint32_t>("header magic"));
  if (magic != 0x46554747u) {  // "GGUF" little-endian
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad magic (not a GGUF file): 0x", absl::Hex(magic)));
  }
  POLYKV_ASSIGN_OR_RETURN(version, r.Read<uint32_t>("header version"));
  if (version != 2 && version != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": unsupported GGUF version ", version, " (PolyKV reads versions 2 and 3",
        (version > 0xffff ? "; big-endian files are not supported" : ""), ")"));
  }
  POLYKV_ASSIGN_OR_RETURN(*n_tensors, r.Read<uint64_t>("header tensor_count"));
  POLYKV_ASSIGN_OR_RETURN(*n_kv, r.Read<uint64_t>("header metadata_kv_count"));
  // Each kv needs >= 8 (key length) + 4 (type) + 1 bytes; each tensor >= 8 + 4 + 4 + 8.
  if (*n_kv > r.remaining() / 13) {
    return absl::DataLossError(absl::StrCat("GGUF truncated or corrupt: metadata_kv_count ", *n_kv,
                                            " cannot fit in the remaining ", r.remaining(),
                                            " bytes"));
  }
  if (*n_tensors > r.remaining() / 24) {
    return absl::DataLossError(absl::StrCat("GGUF truncated or corrupt: tensor_count ", *n_tensors,
                                            " cannot fit in the remaining ", r.remaining(),
                                            " bytes"));
  }
  return absl::OkStatus();
}

Status GgufFile::Impl::ParseMetadata(Reader& r, uint64_t n_kv) {
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string what = absl::StrCat("metadata key #", k);
    POLYKV_ASSIGN_OR_RETURN(std::string_view key_sv, r.ReadString(what));
    std::string key(key_sv);
    what = absl::StrCat("metadata '", key, "'");
    if (meta.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF duplicate ", what));
    }
    POLYKV_ASSIGN_OR_RETURN(uint32_t type, r.Read<uint32_t>(what + " type"));
    if (type >= kNumValueTypes) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF ", what, " has unknown value type ", type));
    }
    POLYKV_ASSIGN_OR_RETURN(MetaValue v, ReadMetaValue(r, type, what));
    keys.push_back(key);
    meta.emplace(key, std::move(v));
  }
  return absl::OkStatus();
}

StatusOr<MetaValue> GgufFile::Impl::ReadMetaValue(Reader& r, uint32_t type,
                                                  const std::string& what) {
  MetaValue v;
  v.type = type;
  if (IsInt(type)) {
    POLYKV_RETURN_IF_ERROR(kValueTypes[type].read_int(r, what, &v));
    return v;
  }
  switch (type) {
    case kF32: {
      POLYKV_ASSIGN_OR_RETURN(float x, r.Read<float>(what));
      v.f = x;
      break;
    }
    case kF64: {
      POLYKV_ASSIGN_OR_RETURN(double x, r.Read<double>(what));
      v.f = x;
      break;
    }
    case kBool: {
      POLYKV_ASSIGN_OR_RETURN(uint8_t x, r.Read<uint8_t>(what));
      if (x > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF ", what, " bool has invalid value ", static_cast<int>(x)));
      }
      v.u = x;
      v.i = x;
      break;
    }
    case kString: {
      POLYKV_ASSIGN_OR_RETURN(std::string_view s, r.ReadString(what));
      v.s = std::string(s);
      break;
    }
    case kArray: {
      uint64_t start = r.pos();
      POLYKV_RETURN_IF_ERROR(ValidateValue(r, kArray, what, 0));
      // Re-read the (now validated) array header.
      std::memcpy(&v.elem_type, data + start, 4);
      std::memcpy(&v.count, data + start + 4, 8);
      v.data_offset = start + 12;
      break;
    }
  }
  return v;
}

StatusOr<uint64_t> GgufFile::Impl::Alignment() const {
  const MetaValue* a = Find("general.alignment");
  if (a == nullptr) return kDefaultAlignment;
  if (a->type != kU32) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF general.alignment must be u32, got ", ValueTypeName(a->type)));
  }
  if (a->u == 0 || (a->u & (a->u - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF general.alignment ", a->u, " is not a power of two"));
  }
  return a->u;
}

Status GgufFile::Impl::ParseTensorInfos(Reader& r, uint64_t n_tensors, uint64_t alignment) {
  tensors.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    POLYKV_ASSIGN_OR_RETURN(GgufTensorInfo t, ReadTensorInfo(r, k, alignment));
    tensor_index.emplace(t.name, tensors.size());
    tensors.push_back(std::move(t));
  }
  return absl::OkStatus();
}

StatusOr<GgufTensorInfo> GgufFile::Impl::ReadTensorInfo(Reader& r, uint64_t k, uint64_t alignment) {
  std::string what = absl::StrCat("tensor #", k);
  POLYKV_ASSIGN_OR_RETURN(std::string_view name_sv, r.ReadString(what + " name"));
  GgufTensorInfo t;
  t.name = std::string(name_sv);
  what = absl::StrCat("tensor ", t.name);
  if (tensor_index.count(t.name)) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF duplicate tensor name ", t.name));
  }
  POLYKV_ASSIGN_OR_RETURN(uint32_t n_dims, r.Read<uint32_t>(what + " n_dims"));
  if (n_dims > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF ", what, " has n_dims ", n_dims, " > ", kMaxDims));
  }
  uint64_t elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    POLYKV_ASSIGN_OR_RETURN(uint64_t dim, r.Read<uint64_t>(absl::StrCat(what, " dim ", d)));
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        MulOverflow(elements, dim, &elements) ||
        elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF ", what, " dims overflow 63 bits at dim ", d, " (", dim, ")"));
    }
    t.dims.push_back(static_cast<int64_t>(dim));
  }
  POLYKV_ASSIGN_OR_RETURN(t.type, r.Read<uint32_t>(what + " type"));
  POLYKV_ASSIGN_OR_RETURN(uint64_t rel_offset, r.Read<uint64_t>(what + " offset"));
  TypeTraits tr = Traits(t.type);
  if (tr.name == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF ", what, " has unknown ggml type ", t.type));
  }
  if (tr.block == 0) {
    return absl::UnimplementedError(absl::StrCat(what, " has ggml type ", tr.name, " (", t.type,
                                                 "), which PolyKV does not support"));
  }
  if (!t.dims.empty() && t.dims[0] % tr.block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF ", what, " row length ", t.dims[0],
                                                   " is not a multiple of the ", tr.name,
                                                   " block size ", tr.block));
  }
  auto nbytes = GgmlTypeBytes(t.type, static_cast<int64_t>(elements));
  if (!nbytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF ", what, ": ", nbytes.status().message()));
  }
  t.nbytes = *nbytes;
  if (rel_offset % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF ", what, " offset ", rel_offset, " is not a multiple of the alignment ", alignment));
  }
  t.offset = rel_offset;  // made absolute by PlaceTensorData
  return t;
}

Status GgufFile::Impl::PlaceTensorData(const Reader& r, uint64_t n_tensors, uint64_t alignment) {
  // Data section starts at the next multiple of `alignment`.
  uint64_t data_start = r.pos();
  uint64_t pad = (alignment - data_start % alignment) % alignment;
  if (n_tensors > 0) {
    if (pad > r.remaining()) {
      return absl::DataLossError(absl::StrCat("GGUF truncated: tensor data section (offset ",
                                              data_start + pad, ") lies past the end of the ", size,
                                              "-byte file"));
    }
  }
  data_start += pad;
  for (GgufTensorInfo& t : tensors) {
    uint64_t avail = size >= data_start ? size - data_start : 0;
    if (t.offset > avail || t.nbytes > avail - t.offset) {
      return absl::DataLossError(absl::StrCat("GGUF tensor ", t.name, " data [", t.offset, ", +",
                                              t.nbytes, ") relative to the data section at ",
                                              data_start, " lies outside the ", size,
                                              "-byte file (truncated or corrupt offset)"));
    }
    t.offset += data_start;
  }
  return absl::OkStatus();
}

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::~GgufFile() = default;

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    std::string msg = absl::StrCat("cannot open GGUF file ", path, ": ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  impl->size = static_cast<uint64_t>(st.st_size);
  if (impl->size < 24) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("GGUF truncated: ", path, " is ", impl->size,
                                            " bytes, smaller than the 24-byte header"));
  }
  void* m = mmap(nullptr, impl->size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of ", path, " failed: ", std::strerror(errno)));
  }
  impl->map = m;
  impl->map_size = impl->size;
  impl->data = static_cast<const uint8_t*>(m);
  Status s = impl->Parse();
  if (!s.ok()) {
    return Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return std::unique_ptr<GgufFile>(new GgufFile(std::move(impl)));
}

uint32_t GgufFile::version() const { return impl_->version; }
const std::string& GgufFile::path() const { return impl_->path; }
bool GgufFile::Has(std::string_view key) const { return impl_->Find(key) != nullptr; }
std::vector<std::string> GgufFile::Keys() const { return impl_->keys; }
const std::vector<GgufTensorInfo>& GgufFile::tensors() const { return impl_->tensors; }

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(std::string(name));
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

absl::Span<const uint8_t> GgufFile::TensorData(const GgufTensorInfo& info) const {
  // Validated at Open for tensors of this file; guard against foreign infos.
  if (info.offset > impl_->size || info.nbytes > impl_->size - info.offset) return {};
  return absl::Span<const uint8_t>(impl_->data + info.offset, info.nbytes);
}

namespace {
Status NotFound(std::string_view key) {
  return absl::NotFoundError(absl::StrCat("GGUF metadata key '", std::string(key), "' not found"));
}
Status Mismatch(std::string_view key, const char* want, uint32_t got, uint32_t elem = 99) {
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF metadata '", std::string(key), "' is ", ValueTypeName(got),
                   got == kArray ? absl::StrCat(" of ", ValueTypeName(elem)) : std::string(),
                   ", expected ", want));
}
}  // namespace

StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const MetaValue* v = impl_->Find(key);
  if (!v) return NotFound(key);
  if (v->type != kString) return Mismatch(key, "string", v->type, v->elem_type);
  return v->s;
}

StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const MetaValue* v = impl_->Find(key);
  if (!v) return NotFound(key);
  if (!IsInt(v->type)) return Mismatch(key, "an integer", v->type, v->elem_type);
  if (v->type == kU64 && v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::OutOfRangeError(
        absl::StrCat("GGUF metadata '", std::string(key), "' value ", v->u, " does not fit int64"));
  }
  return v->i;
}

StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const MetaValue* v = impl_->Find(key);
  if (!v) return NotFound(key);
  if (v->type == kF32 || v->type == kF64) return v->f;
  if (IsInt(v->type))
    return v->type == kU64 ? static_cast<double>(v->u) : static_cast<double>(v->i);
  return Mismatch(key, "a number", v->type, v->elem_type);
}

StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const MetaValue* v = impl_->Find(key);
  if (!v) return NotFound(key);
  if (v->type != kBool) return Mismatch(key, "bool", v->type, v->elem_type);
  return v->u != 0;
}

StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const MetaValue* v = impl_->Find(key);
  if (!v) return NotFound(key);
  if (v->type != kArray || v->elem_type != kString) {
    return Mismatch(key, "array of string", v->type, v->elem_type);
  }
  std::vector<std::string> out;
  out.reserve(v->count);
  Reader r(impl_->data, impl_->size);
  POLYKV_RETURN_IF_ERROR(r.Skip(v->data_offset, "array"));
  for (uint64_t k = 0; k < v->count; ++k) {
    POLYKV_ASSIGN_OR_RETURN(std::string_view s, r.ReadString(std::string(key)));
    out.emplace_back(s);
  }
  return out;
}

namespace {
template <typename Out>
bool ReadNumericArray(const uint8_t* p, uint32_t et, uint64_t n, std::vector<Out>* out) {
  out->resize(n);
  if (n == 0) return true;
  const auto load = et < kNumValueTypes ? kValueTypes[et].load : nullptr;
  if (load == nullptr) return false;
  for (uint64_t k = 0; k < n; ++k) (*out)[k] = static_cast<Out>(load(p, k));
  return true;
}
}  // namespace

StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  const MetaValue* v = impl_->Find(key);
  if (!v) return NotFound(key);
  if (v->type != kArray || !(v->elem_type == kF32 || v->elem_type == kF64 || IsInt(v->elem_type))) {
    return Mismatch(key, "array of numbers", v->type, v->elem_type);
  }
  std::vector<float> out;
  ReadNumericArray(impl_->data + v->data_offset, v->elem_type, v->count, &out);
  return out;
}

StatusOr<std::vector<int32_t>> GgufFile::GetIntArray(std::string_view key) const {
  const MetaValue* v = impl_->Find(key);
  if (!v) return NotFound(key);
  if (v->type != kArray || !IsInt(v->elem_type)) {
    return Mismatch(key, "array of integers", v->type, v->elem_type);
  }
  if (v->elem_type == kU32 || v->elem_type == kU64 || v->elem_type == kI64) {
    // Range-check wide types.
    std::vector<double> wide;
    ReadNumericArray(impl_->data + v->data_offset, v->elem_type, v->count, &wide);
    for (uint64_t k = 0; k < wide.size(); ++k) {
      if (wide[k] < std::numeric_limits<int32_t>::min() ||
          wide[k] > std::numeric_limits<int32_t>::max()) {
        return absl::OutOfRangeError(
            absl::StrCat("GGUF metadata '", std::string(key), "'[", k, "] does not fit int32"));
      }
    }
  }
  std::vector<int32_t> out;
  ReadNumericArray(impl_->data + v->data_offset, v->elem_type, v->count, &out);
  return out;
}

}  // namespace polykv::model

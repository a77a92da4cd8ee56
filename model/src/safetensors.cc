// Safetensors header validation and tensor reads (see safetensors.h).
#include "safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "polykv/kernels/dtype_convert.h"

namespace polykv::model {
namespace {

// Element size of a safetensors dtype; 0 for an unknown dtype string.
uint64_t DtypeSize(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB

Status ReadExact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
    ssize_t got = ::pread(fd, p, want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    }
    if (got == 0) return absl::DataLossError(absl::StrCat(path, ": unexpected end of file"));
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<void*>(map_), static_cast<size_t>(file_size_));
  if (fd_ >= 0) ::close(fd_);
}

absl::Span<const uint8_t> SafetensorsFile::Data(const SafetensorsEntry& entry) const {
  if (map_ == nullptr || entry.offset > file_size_ || entry.nbytes > file_size_ - entry.offset)
    return {};
  return absl::MakeConstSpan(static_cast<const uint8_t*>(map_) + entry.offset,
                             static_cast<size_t>(entry.nbytes));
}

const SafetensorsEntry* SafetensorsFile::Find(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0 || !S_ISREG(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  f->file_size_ = static_cast<uint64_t>(st.st_size);
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed safetensors: ", what));
  };
  if (f->file_size_ < 8)
    return bad(
        absl::StrCat("file is ", f->file_size_, " bytes, shorter than the 8-byte header length"));
  uint8_t len_bytes[8];
  POLYKV_RETURN_IF_ERROR(ReadExact(f->fd_, len_bytes, 8, 0, path));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > f->file_size_ - 8)
    return bad(absl::StrCat("header length ", header_len, " exceeds the file size ", f->file_size_,
                            " - 8"));
  if (header_len > kMaxHeaderBytes)
    return bad(absl::StrCat("header length ", header_len, " exceeds the 100 MB limit"));
  if (header_len < 2) return bad("header length < 2 (not a JSON object)");
  std::string header(header_len, '\0');
  POLYKV_RETURN_IF_ERROR(ReadExact(f->fd_, header.data(), header_len, 8, path));
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("header is not valid JSON");
  if (!j.is_object()) return bad("header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = f->file_size_ - data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const auto& v = it.value();
    const std::string where = absl::StrCat("tensor '", name, "': ");
    if (!v.is_object()) return bad(where + "entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string())
      return bad(where + "missing string 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) return bad(where + "missing array 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      return bad(where + "'data_offsets' must be an array of 2 integers");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    const uint64_t esize = DtypeSize(e.dtype);
    if (esize == 0) return bad(absl::StrCat(where, "unknown dtype '", e.dtype, "'"));
    uint64_t elems = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return bad(where + "shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && elems > std::numeric_limits<uint64_t>::max() / dim)
        return bad(where + "shape product overflows");
      elems *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    if (elems > std::numeric_limits<uint64_t>::max() / esize)
      return bad(where + "shape x dtype size overflows");
    const auto& offs = v["data_offsets"];
    if (!offs[0].is_number_integer() || !offs[1].is_number_integer() ||
        offs[0].get<int64_t>() < 0 || offs[1].get<int64_t>() < 0)
      return bad(where + "'data_offsets' must be non-negative integers");
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end) return bad(absl::StrCat(where, "data_offsets begin ", begin, " > end ", end));
    if (end > data_size)
      return bad(absl::StrCat(where, "data_offsets [", begin, ", ", end,
                              ") lie outside the data section of ", data_size, " bytes"));
    if (end - begin != elems * esize)
      return bad(absl::StrCat(where, "shape x dtype size = ", elems * esize,
                              " bytes but data_offsets span ", end - begin, " bytes"));
    e.offset = data_start + begin;
    e.nbytes = end - begin;
    f->entries_.push_back(std::move(e));
  }
  // Map the whole file read-only and shared: the mapped runtime computes on these pages,
  // which every process on the host shares through the page cache.
  void* map = ::mmap(nullptr, static_cast<size_t>(f->file_size_), PROT_READ, MAP_SHARED, f->fd_, 0);
  if (map == MAP_FAILED)
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": cannot map ", f->file_size_, " bytes: ", std::strerror(errno)));
  f->map_ = map;
  return f;
}

StatusOr<std::vector<float>> SafetensorsFile::ReadF32(const SafetensorsEntry& entry) const {
  size_t elem = 0;
  if (entry.dtype == "F32") {
    elem = 4;
  } else if (entry.dtype == "F16" || entry.dtype == "BF16") {
    elem = 2;
  } else {
    return absl::UnimplementedError(absl::StrCat(path_, ": tensor '", entry.name, "' has dtype ",
                                                 entry.dtype,
                                                 "; only F32, F16, BF16 are supported"));
  }
  const size_t count = static_cast<size_t>(entry.nbytes / elem);
  std::vector<uint8_t> raw(static_cast<size_t>(entry.nbytes));
  POLYKV_RETURN_IF_ERROR(ReadExact(fd_, raw.data(), entry.nbytes, entry.offset, path_));
  std::vector<float> out(count);
  if (elem == 4) {
    // (An empty tensor - a 0 in its shape - has no bytes: memcpy of its null data is UB.)
    if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  } else {
    const bool bf16 = entry.dtype == "BF16";
    for (size_t i = 0; i < count; ++i) {
      const uint8_t* p = raw.data() + 2 * i;
      out[i] = bf16 ? kernels::dtype::LoadBf16(p) : kernels::dtype::LoadF16(p);
    }
  }
  return out;
}

}  // namespace polykv::model

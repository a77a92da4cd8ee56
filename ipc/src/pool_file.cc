// Pool files (see pool_file.h): atomic write, manifest read, verified region read.
#include "polykv/ipc/pool_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "polykv/ipc/pool_layout.h"
#include "protocol_json.h"

namespace polykv::ipc {
namespace {

using nlohmann::json;

constexpr uint64_t kAlign = 4096;

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

void Put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status Errno(const std::string& what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

uint64_t PreludeChecksum(const uint8_t* prelude, const std::string& manifest) {
  std::vector<uint8_t> buf(40 + manifest.size());
  std::memcpy(buf.data(), prelude, 40);
  std::memcpy(buf.data() + 40, manifest.data(), manifest.size());
  return Checksum64(buf.data(), buf.size());
}

json ManifestJson(const PoolInfo& p, uint32_t pool_format_version, uint64_t checksum) {
  json j = internal::PoolInfoJson(p);  // the protocol's field names, one list
  j.erase("leases");                   // a live figure, not a property of the file
  j["file_version"] = kPoolFileVersion;
  j["pool_format_version"] = pool_format_version;
  j["checksum"] = "xxh64:" + Hex16(checksum);
  return j;
}

// Writes all of `data` at the file offset `off`.
Status PWriteAll(int fd, const void* data, uint64_t n, uint64_t off, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = pwrite(fd, p, std::min<uint64_t>(n, 64u << 20), static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    p += w;
    off += static_cast<uint64_t>(w);
    n -= static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

Status PReadAll(int fd, void* data, uint64_t n, uint64_t off, const std::string& path) {
  uint8_t* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t r = pread(fd, p, std::min<uint64_t>(n, 64u << 20), static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read", path);
    }
    if (r == 0) return absl::DataLossError(absl::StrCat(path, " is truncated"));
    p += r;
    off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

Status WritePoolFile(const std::string& path, const PoolInfo& info, const void* pool,
                     uint64_t bytes) {
  if (pool == nullptr || bytes < kPoolHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool region of ", bytes, " bytes is too small"));
  }
  POLYKV_ASSIGN_OR_RETURN(PoolReader reader, PoolReader::Open(pool, bytes, false));
  const std::string header_id = absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(reader.header().pool_id), sizeof(reader.header().pool_id)));
  if (header_id != info.id) {
    return absl::InvalidArgumentError(absl::StrCat("pool region has id ", header_id.substr(0, 16),
                                                   ", the manifest says ", info.id.substr(0, 16)));
  }
  const uint64_t region = reader.header().total_bytes;
  const uint64_t checksum = Checksum64(pool, region);
  const std::string manifest = ManifestJson(info, reader.header().format_version, checksum).dump();
  const uint64_t pool_offset = AlignUp(kPoolFilePrelude + manifest.size());
  std::vector<uint8_t> head(pool_offset, 0);
  std::memcpy(head.data(), kPoolFileMagic, 8);
  Put32(head.data() + 8, kPoolFileVersion);
  Put32(head.data() + 12, static_cast<uint32_t>(manifest.size()));
  Put64(head.data() + 16, pool_offset);
  Put64(head.data() + 24, region);
  Put64(head.data() + 32, checksum);
  Put64(head.data() + 40, PreludeChecksum(head.data(), manifest));
  std::memcpy(head.data() + kPoolFilePrelude, manifest.data(), manifest.size());

  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  Status s;
  {
    Fd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640));
    if (fd.get() < 0) return Errno("create", tmp);
    s = PWriteAll(fd.get(), head.data(), head.size(), 0, tmp);
    if (s.ok()) s = PWriteAll(fd.get(), pool, region, pool_offset, tmp);
    if (s.ok() && fsync(fd.get()) != 0) s = Errno("fsync", tmp);
  }
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = Errno("rename to", path);
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  // The rename is durable once the folder is synced.
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  Fd dfd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) (void)fsync(dfd.get());
  return absl::OkStatus();
}

StatusOr<PoolFileManifest> ReadPoolFileManifest(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Errno("open", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno("stat", path);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kPoolFilePrelude) {
    return absl::DataLossError(absl::StrCat(path, " is truncated (", file_size, " bytes)"));
  }
  uint8_t prelude[kPoolFilePrelude];
  POLYKV_RETURN_IF_ERROR(PReadAll(fd.get(), prelude, sizeof(prelude), 0, path));
  if (std::memcmp(prelude, kPoolFileMagic, 8) != 0) {
    return absl::DataLossError(absl::StrCat(path, " is not a pool file (bad magic)"));
  }
  PoolFileManifest m;
  m.file_version = Get32(prelude + 8);
  if (m.file_version != kPoolFileVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " has pool file version ", m.file_version, "; this build reads ", kPoolFileVersion));
  }
  const uint32_t manifest_bytes = Get32(prelude + 12);
  m.pool_offset = Get64(prelude + 16);
  m.pool_bytes = Get64(prelude + 24);
  m.pool_checksum = Get64(prelude + 32);
  if (manifest_bytes > (1u << 20) || m.pool_offset != AlignUp(kPoolFilePrelude + manifest_bytes)) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt prelude (manifest of ", manifest_bytes,
                                            " bytes at region offset ", m.pool_offset, ")"));
  }
  if (m.pool_bytes > file_size || m.pool_offset > file_size - m.pool_bytes) {
    return absl::DataLossError(absl::StrCat(path, " is truncated: ", file_size,
                                            " bytes, the region needs ",
                                            m.pool_offset + m.pool_bytes));
  }
  std::string manifest(manifest_bytes, '\0');
  POLYKV_RETURN_IF_ERROR(
      PReadAll(fd.get(), manifest.data(), manifest_bytes, kPoolFilePrelude, path));
  if (PreludeChecksum(prelude, manifest) != Get64(prelude + 40)) {
    return absl::DataLossError(absl::StrCat(path, ": manifest checksum mismatch"));
  }
  try {
    json j = json::parse(manifest);
    m.pool_format_version = j.at("pool_format_version").get<uint32_t>();
    for (const char* field :
         {"id", "model_fingerprint", "codec", "tokens", "layers", "total_bytes", "checksum"}) {
      if (!j.contains(field))
        return absl::DataLossError(absl::StrCat(path, ": bad manifest: no \"", field, "\""));
    }
    auto info = internal::PoolInfoFromJsonObject(j, "manifest");
    if (!info.ok()) {
      return absl::DataLossError(absl::StrCat(path, ": bad manifest: ", info.status().message()));
    }
    m.info = *std::move(info);
    if (j.at("checksum").get<std::string>() != "xxh64:" + Hex16(m.pool_checksum)) {
      return absl::DataLossError(absl::StrCat(path, ": manifest and prelude checksums differ"));
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": bad manifest: ", e.what()));
  }
  if (m.pool_format_version != kPoolFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, " holds a pool of format version ",
                                                      m.pool_format_version, "; this build reads ",
                                                      kPoolFormatVersion));
  }
  if (m.info.total_bytes != m.pool_bytes || m.info.id.size() != 64) {
    return absl::DataLossError(absl::StrCat(path, ": manifest disagrees with the prelude"));
  }
  return m;
}

Status ReadPoolFileInto(const std::string& path, const PoolFileManifest& m, void* dst,
                        uint64_t dst_bytes) {
  if (dst_bytes < m.pool_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination of ", dst_bytes, " bytes is smaller than the pool's ", m.pool_bytes));
  }
  {
    Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return Errno("open", path);
    POLYKV_RETURN_IF_ERROR(PReadAll(fd.get(), dst, m.pool_bytes, m.pool_offset, path));
  }
  const uint64_t sum = Checksum64(dst, m.pool_bytes);
  if (sum != m.pool_checksum) {
    return absl::DataLossError(absl::StrCat(path, ": region checksum ", Hex16(sum), " != manifest ",
                                            Hex16(m.pool_checksum)));
  }
  auto reader = PoolReader::Open(dst, m.pool_bytes, /*verify_payload=*/true);
  if (!reader.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", reader.status().message()));
  }
  const std::string header_id = absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(reader->header().pool_id), sizeof(reader->header().pool_id)));
  if (header_id != m.info.id || reader->params().model_fingerprint != m.info.model_fingerprint) {
    return absl::DataLossError(absl::StrCat(path,
                                            ": region id/model fingerprint differ from "
                                            "the manifest"));
  }
  return absl::OkStatus();
}

}  // namespace polykv::ipc

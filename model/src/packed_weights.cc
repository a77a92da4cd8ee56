// Packed weights shared through one file per model (see packed_weights.h).
#include "packed_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "polykv/kernels/cpu.h"

namespace polykv::model::internal {
namespace {

// File: a 4 KiB header page, then every packed matrix at a 4 KiB-aligned offset.
constexpr char kMagic[8] = {'P', 'K', 'V', 'P', 'A', 'C', 'K', '1'};
constexpr uint32_t kLayoutVersion = 1;  // kernels::PackWeights' layout
constexpr int64_t kPage = 4096;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t matrices;
  uint64_t bytes;      // the whole file
  uint64_t shape_sum;  // sum over matrices of (type, rows, cols) mixed: catches a mismatch
};

std::string Errno(const char* step, const std::string& path) {
  return absl::StrCat(step, " ", path, ": ", std::strerror(errno));
}

int64_t AlignUp(int64_t v) { return (v + kPage - 1) / kPage * kPage; }

// Every packable matrix of `w` (the tied lm_head shares the embedding's bytes, packed once
// for the lm_head: the embedding itself is only read a row at a time).
std::vector<kernels::WeightView*> Packable(MappedWeights& w) {
  std::vector<kernels::WeightView*> out;
  auto add = [&](MappedMatrix& m) {
    if (kernels::PackedLayoutSupported(m.w.type) && m.w.rows > 0) out.push_back(&m.w);
  };
  for (MappedLayer& l : w.layers)
    for (MappedMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) add(*m);
  add(w.lm_head);
  return out;
}

Header ExpectedHeader(const std::vector<kernels::WeightView*>& mats,
                      std::vector<int64_t>* offsets) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kLayoutVersion;
  h.matrices = static_cast<uint32_t>(mats.size());
  int64_t at = kPage;
  uint64_t mix = 1469598103934665603ull;
  for (const kernels::WeightView* v : mats) {
    offsets->push_back(at);
    at += AlignUp(kernels::PackedWeightBytes(*v));
    for (uint64_t x : {static_cast<uint64_t>(v->type), static_cast<uint64_t>(v->rows),
                       static_cast<uint64_t>(v->cols)})
      mix = (mix ^ x) * 1099511628211ull;
  }
  h.bytes = static_cast<uint64_t>(at);
  h.shape_sum = mix;
  return h;
}

// Maps `fd` (h.bytes long) read-only.
StatusOr<const uint8_t*> MapReadOnly(int fd, const Header& h, const std::string& path) {
  void* p = mmap(nullptr, h.bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return absl::ResourceExhaustedError(Errno("mmap", path));
  return static_cast<const uint8_t*>(p);
}

// An existing file that matches `want` and is safe to trust, mapped; nullptr when it is
// absent or stale (then it is rewritten). A file of another owner, or writable by others,
// is an error (someone else could change the weights under us).
StatusOr<const uint8_t*> OpenExisting(const std::string& path, const Header& want) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return nullptr;
    return absl::PermissionDeniedError(Errno("open", path));
  }
  struct stat st;
  Header h{};
  StatusOr<const uint8_t*> out = static_cast<const uint8_t*>(nullptr);
  if (fstat(fd, &st) != 0) {
    out = absl::InternalError(Errno("fstat", path));
  } else if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 ||
             !S_ISREG(st.st_mode)) {
    out = absl::PermissionDeniedError(
        absl::StrCat(path, ": not a regular file of this user writable only by it"));
  } else if (static_cast<uint64_t>(st.st_size) == want.bytes &&
             pread(fd, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)) &&
             std::memcmp(&h, &want, sizeof(h)) == 0) {
    out = MapReadOnly(fd, want, path);
  }
  close(fd);
  return out;
}

// Writes the file: a temporary in the same folder, packed into a heap buffer and written with
// pwrite (so that the page cache holds it in large folios, which the
// read-only mappings then map with 2 MiB pages where the kernel and file system allow:
// on ext4 / Linux 6.18, 10 -> 94 MB of the file PMD-mapped and 1-thread decode ~+15% against
// a file written through a shared mapping), flushed, renamed over `path`; then mapped.
StatusOr<const uint8_t*> Create(const std::string& path, const Header& h,
                                const std::vector<kernels::WeightView*>& mats,
                                const std::vector<int64_t>& offsets) {
  std::string tmp = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return absl::PermissionDeniedError(Errno("create", tmp));
  Status st = absl::OkStatus();
  if (fchmod(fd, 0600) != 0) st = absl::InternalError(Errno("chmod", tmp));
  if (st.ok() && posix_fallocate(fd, 0, static_cast<off_t>(h.bytes)) != 0)
    st = absl::ResourceExhaustedError(absl::StrCat("allocate ", h.bytes, " bytes for ", tmp));
  // Writes `n` bytes at `off` (retrying short writes).
  auto write_at = [&](const uint8_t* p, int64_t n, int64_t off) {
    while (st.ok() && n > 0) {
      const ssize_t w = pwrite(fd, p, static_cast<size_t>(n), static_cast<off_t>(off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        st = absl::ResourceExhaustedError(Errno("write", tmp));
        break;
      }
      p += w;
      n -= w;
      off += w;
    }
  };
  // The file streams through a 4 MiB window written whole and in order (whole, aligned
  // writes get the largest folios); each matrix is packed into its own buffer first, so the
  // peak is the largest matrix + 4 MiB, not the file. Gaps (page padding) stay zero.
  constexpr int64_t kWrite = int64_t{4} << 20;
  const int64_t total = static_cast<int64_t>(h.bytes);
  std::vector<uint8_t> window, packed;
  int64_t w0 = 0;                                             // file offset of window[0]
  auto put = [&](const uint8_t* p, int64_t n, int64_t off) {  // off >= w0, increasing
    while (st.ok() && n > 0) {
      if (off >= w0 + kWrite) {
        write_at(window.data(), kWrite, w0);
        std::fill(window.begin(), window.end(), 0);
        w0 += kWrite;
        continue;
      }
      const int64_t at = off - w0, k = std::min(n, kWrite - at);
      std::memcpy(window.data() + at, p, static_cast<size_t>(k));
      p += k;
      n -= k;
      off += k;
    }
  };
  try {
    window.assign(static_cast<size_t>(kWrite), 0);
    for (size_t i = 0; st.ok() && i < mats.size(); ++i) {
      const int64_t n = kernels::PackedWeightBytes(*mats[i]);
      packed.resize(static_cast<size_t>(n));
      st = kernels::PackWeights(*mats[i], absl::MakeSpan(packed));
      put(packed.data(), n, offsets[i]);
    }
  } catch (const std::bad_alloc&) {
    st = absl::ResourceExhaustedError(absl::StrCat("packing ", tmp, ": out of memory"));
  }
  if (st.ok()) write_at(window.data(), total - w0, w0);  // the last window
  std::vector<uint8_t>().swap(packed);
  std::vector<uint8_t>().swap(window);
  // The header last: a file torn before this point never matches.
  write_at(reinterpret_cast<const uint8_t*>(&h), sizeof(h), 0);
  if (st.ok() && fsync(fd) != 0) st = absl::InternalError(Errno("fsync", tmp));
  if (st.ok() && rename(tmp.c_str(), path.c_str()) != 0)
    st = absl::InternalError(Errno("rename to", path));
  StatusOr<const uint8_t*> out = st.ok() ? MapReadOnly(fd, h, path) : StatusOr<const uint8_t*>(st);
  if (!st.ok()) unlink(tmp.c_str());
  close(fd);
  return out;
}

}  // namespace

std::string PackedWeightsDir() { return UserCacheDir("POLYKV_PACKED_CACHE", "packed"); }

StatusOr<std::string> AttachPackedWeights(MappedWeights& w, const std::string& fingerprint,
                                          const std::string& dir) {
  if (dir.empty()) return std::string("blocks: no packed-weights folder ($POLYKV_PACKED_CACHE)");
  if (kernels::BestIsa() != kernels::Isa::kAvx512)
    return std::string("blocks: the packed kernels need AVX-512 VNNI");
  std::vector<kernels::WeightView*> mats = Packable(w);
  if (mats.empty()) return std::string("blocks: no Q4_0/Q4_1/Q8_0 matrices");
  if (fingerprint.empty() || fingerprint.find('/') != std::string::npos)
    return absl::FailedPreconditionError("packed weights: the model has no usable fingerprint");
  std::vector<int64_t> offsets;
  const Header h = ExpectedHeader(mats, &offsets);
  // Folders: created 0700; the last one must be this user's and closed to others.
  std::string partial;
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    partial = dir.substr(0, i);
    if (mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST)
      return absl::PermissionDeniedError(Errno("mkdir", partial));
  }
  struct stat ds;
  if (lstat(dir.c_str(), &ds) != 0) return absl::PermissionDeniedError(Errno("stat", dir));
  if (!S_ISDIR(ds.st_mode) || ds.st_uid != geteuid() || (ds.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": not a folder of this user writable only by it"));
  const std::string path =
      absl::StrCat(dir, "/", fingerprint, "-v", kLayoutVersion, "-", h.shape_sum % 1000000, ".bin");
  POLYKV_ASSIGN_OR_RETURN(const uint8_t* base, OpenExisting(path, h));
  if (base == nullptr) {
    POLYKV_ASSIGN_OR_RETURN(base, Create(path, h, mats, offsets));
  }
  const uint64_t bytes = h.bytes;
  w.files.push_back(std::shared_ptr<const void>(
      base, [bytes](const void* p) { munmap(const_cast<void*>(p), bytes); }));
  for (size_t i = 0; i < mats.size(); ++i) mats[i]->packed = base + offsets[i];
  return absl::StrCat("packed: ", path);
}

}  // namespace polykv::model::internal

// Helpers for the libFuzzer targets: fuzz input as a file (a memfd reached through
// /proc/self/fd, or a named file in a private temp folder for loaders that dispatch on the
// file name), and a check that aborts with a message (libFuzzer saves the input).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace polykv::fuzz {

/// Aborts (a finding) when `cond` is false.
#define POLYKV_FUZZ_CHECK(cond, ...)                          \
  do {                                                        \
    if (!(cond)) {                                            \
      std::fprintf(stderr, "fuzz check failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                      \
      std::fprintf(stderr, "\n");                             \
      std::abort();                                           \
    }                                                         \
  } while (0)

/// One memfd, rewritten with each input; Path() names it for path-based readers.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("polykv-fuzz", MFD_CLOEXEC)) {}
  ~MemFile() {
    if (fd_ >= 0) close(fd_);
  }
  std::string Write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) std::abort();
    size_t off = 0;
    while (off < size) {
      ssize_t n = pwrite(fd_, data + off, size - off, static_cast<off_t>(off));
      if (n <= 0) std::abort();
      off += static_cast<size_t>(n);
    }
    return "/proc/self/fd/" + std::to_string(fd_);
  }

 private:
  int fd_;
};

/// A private folder under /dev/shm (or /tmp) for inputs that must be named files; removed
/// when the fuzzer exits normally (a crash leaves it next to its artifact).
inline const std::string& TempFolder() {
  static const std::string dir = [] {
    std::string tmpl =
        (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + std::string("/polykv-fuzz-XXXXXX");
    char* p = mkdtemp(tmpl.data());
    if (p == nullptr) std::abort();
    // The handler runs after `dir` is destroyed: it removes a copy that is never freed.
    static const std::string* keep = new std::string(p);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*keep, ec);
    });
    return std::string(p);
  }();
  return dir;
}

inline void WriteNamed(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

}  // namespace polykv::fuzz

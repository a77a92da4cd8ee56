// Files for tests and benchmarks (see files.h).
#include "support/files.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

namespace polykv::support {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool FileContains(const std::string& path, std::string_view needle) {
  return ReadFile(path).find(needle) != std::string::npos;
}

absl::Status WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

absl::Status ReplaceFile(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  if (absl::Status s = WriteFile(tmp, bytes); !s.ok()) return s;
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return absl::OkStatus();
}

absl::Status CopyFile(const std::string& from, const std::string& to, mode_t mode) {
  std::ifstream src(from, std::ios::binary);
  if (!src) return absl::NotFoundError("cannot open " + from);
  {
    std::ofstream dst(to, std::ios::binary | std::ios::trunc);
    dst << src.rdbuf();
    dst.close();
    if (!dst) return absl::InternalError("cannot write " + to);
  }
  if (chmod(to.c_str(), mode) != 0) {
    return absl::InternalError("chmod " + to + ": " + std::strerror(errno));
  }
  return absl::OkStatus();
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string SelfExe() {
  std::error_code ec;
  std::string p = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  return ec ? "" : p;
}

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "XXXXXX";
  if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
}

TempDir::~TempDir() { Remove(); }

TempDir::TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, "")) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    Remove();
    path_ = std::exchange(other.path_, "");
  }
  return *this;
}

void TempDir::Remove() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  path_.clear();
}

}  // namespace polykv::support

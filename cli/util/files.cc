// Files named on polykv-cli's command line (see files.h).
#include "util/files.h"

#include <fstream>
#include <iostream>
#include <sstream>

namespace polykv::cli {
namespace {

Status CannotRead(const std::string& path, std::string_view what) {
  std::string message = "cannot read ";
  if (!what.empty()) message.append(what).append(" ");
  return absl::NotFoundError(message + path);
}

}  // namespace

StatusOr<std::string> ReadFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return CannotRead(path, what);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return CannotRead(path, what);
  return ss.str();
}

StatusOr<std::string> ReadFileOrStdin(const std::string& path, std::string_view what) {
  if (path != "-") return ReadFile(path, what);
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  return ss.str();
}

StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes,
                                     std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return CannotRead(path, what);
  std::string bytes(max_bytes, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.bad()) return CannotRead(path, what);
  bytes.resize(static_cast<size_t>(in.gcount()));
  return bytes;
}

Status WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError("cannot write " + path);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError("cannot write " + path + ": write failed");
  return absl::OkStatus();
}

}  // namespace polykv::cli

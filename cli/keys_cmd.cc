// `polykv-cli keys generate FILE`: a CURVE key pair for polykvd's peer channel (--key-file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "commands.h"
#include "polykv/ipc/curve_keys.h"

namespace polykv::cli {
namespace {

void RunGenerate(const std::string& path, bool force) {
  auto keys = ipc::GenerateCurveKeyPair();
  if (!keys.ok()) return FailWith(keys.status());
  const std::string text = ipc::CurveKeyPairFileText(*keys);
  // Written with mode 0600 from the start (never readable by others, not even briefly).
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return FailWith(absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp)));
  }
  const bool wrote =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  close(fd);
  struct stat st {};
  const bool exists = stat(path.c_str(), &st) == 0;
  if (!wrote || (exists && !force) ||
      (force ? rename(tmp.c_str(), path.c_str()) : link(tmp.c_str(), path.c_str())) != 0) {
    const std::string what = "cannot write " + path;
    const Status failed = !wrote ? absl::DataLossError(what + ": write failed")
                          : exists && !force
                              ? absl::AlreadyExistsError(what + ": it exists (--force replaces it)")
                              : absl::ErrnoToStatus(errno, what);  // before unlink() changes errno
    unlink(tmp.c_str());
    return FailWith(failed);
  }
  unlink(tmp.c_str());
  std::cerr << "wrote " << path << " (mode 0600); its public key, for the other daemons' "
            << "--peer-keys-file:\n";
  std::cout << keys->public_key << "\n";
}

}  // namespace

void RegisterKeysCommands(CLI::App& app) {
  static std::string file;
  static bool force = false;
  CLI::App* keys = app.add_subcommand("keys", "CURVE keys of polykvd's peer channel");
  keys->require_subcommand(1);
  CLI::App* gen = keys->add_subcommand(
      "generate", "Write a new key pair to FILE (mode 0600) and print its public key");
  gen->add_option("FILE", file, "key pair file to write (polykvd --key-file)")->required();
  gen->add_flag("--force", force, "replace FILE when it exists");
  gen->callback([] { RunGenerate(file, force); });
}

}  // namespace polykv::cli

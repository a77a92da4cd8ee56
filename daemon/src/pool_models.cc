// PoolManager's models (see pool_manager.h): opening a model file or folder under the model
// folders without following a swapped path, loading it through the bounded LRU cache, and
// checking that a persisted or replicated pool's model is the one this daemon serves.
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "pool_manager_internal.h"

namespace polykv::daemon {

/// `path` with "//", "." and ".." removed lexically ("" for a relative path). "/.." is "/".
std::string LexicalNormal(const std::string& path) {
  if (path.empty() || path[0] != '/') return "";
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.emplace_back(part);
  }
  return "/" + absl::StrJoin(parts, "/");
}

StatusOr<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) {
    return Status(errno == ENOENT || errno == ENOTDIR ? absl::StatusCode::kNotFound
                                                      : absl::StatusCode::kPermissionDenied,
                  std::strerror(errno));
  }
  return std::string(buf);
}

namespace {

/// Whether `path` is `root` or lies under it (both normalized, absolute).
bool Under(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path[0] == '/';
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

bool UnderAny(const std::string& path, const std::vector<std::string>& roots) {
  for (const auto& r : roots) {
    if (Under(path, r)) return true;
  }
  return false;
}

std::string FdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

/// The path the kernel has for an open descriptor, or "" when /proc is unavailable.
std::string PathOfFd(int fd) {
  char buf[PATH_MAX];
  ssize_t n = readlink(FdPath(fd).c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

}  // namespace

StatusOr<PoolManager::OpenedModel> PoolManager::OpenModel(const std::string& name,
                                                          const Requester& who) const {
  if (name.empty()) return absl::InvalidArgumentError("model path is empty");
  if (name.find('\0') != std::string::npos || name.size() > PATH_MAX) {
    return absl::InvalidArgumentError("model path is not a valid path");
  }
  const bool confined = !options_.models_dirs.empty();
  const std::string shown = ipc::Abbreviate(name, 256);
  if (!confined && !who.trusted_paths) {
    return absl::PermissionDeniedError(
        absl::StrCat("uid ", who.uid,
                     " may not name model files: this polykvd has no --models-dir, so only "
                     "its own uid and root may (ask its administrator to configure --models-dir)"));
  }
  const std::string outside =
      absl::StrCat("model \"", shown, "\" is outside the model folders (--models-dir ",
                   absl::StrJoin(options_.models_dirs, ", "), ")");
  // Candidates in search order. Under confinement every candidate is checked lexically
  // first, so the answer for a path outside the folders never depends on what is there.
  std::vector<std::string> candidates;
  if (name[0] == '/') {
    candidates.push_back(name);
  } else {
    for (const auto& dir : options_.model_path) {
      if (!dir.empty()) candidates.push_back(absl::StrCat(dir, "/", name));
    }
    for (const auto& dir : options_.models_dirs) candidates.push_back(absl::StrCat(dir, "/", name));
    if (!confined) candidates.push_back(name);
  }
  bool any_inside = false;
  Status last = absl::NotFoundError("not found");
  for (const std::string& candidate : candidates) {
    if (confined) {
      std::string lexical = LexicalNormal(candidate);
      if (lexical.empty()) {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof(cwd)) != nullptr)
          lexical = LexicalNormal(absl::StrCat(cwd, "/", candidate));
      }
      if (!UnderAny(lexical, roots_given_) && !UnderAny(lexical, roots_)) continue;
      any_inside = true;
    }
    auto canonical = RealPath(candidate);
    if (!canonical.ok()) {
      last = canonical.status();
      continue;
    }
    if (confined && !UnderAny(*canonical, roots_)) {
      return absl::PermissionDeniedError(
          absl::StrCat("model \"", shown,
                       "\" resolves (through a symlink) to a path outside the model "
                       "folders; refusing to open it"));
    }
    const int fd =
        open(canonical->c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
      last = Status(
          errno == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kPermissionDenied,
          std::strerror(errno));
      continue;
    }
    OpenedModel opened;
    opened.fd.Reset(fd);
    struct stat st;
    if (fstat(fd, &st) != 0) return absl::InternalError("fstat of the model failed");
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model \"", shown,
                       "\" is not a regular file or a folder (a FIFO, device or socket "
                       "would block or mislead the loader)"));
    }
    // The opened inode's own path, immune to a rename or symlink swap since realpath.
    std::string actual = PathOfFd(fd);
    if (actual.empty()) actual = *canonical;
    if (confined && !UnderAny(actual, roots_)) return absl::PermissionDeniedError(outside);
    if (S_ISDIR(st.st_mode)) {
      // An HF folder: the loader opens files inside by name. Refuse entries that are not
      // regular files or folders, and symlinks that lead outside the model folders.
      DIR* d = fdopendir(dup(fd));
      if (d == nullptr) return absl::InternalError("cannot list the model folder");
      Status bad;
      while (dirent* e = readdir(d)) {
        const std::string entry = e->d_name;
        if (entry == "." || entry == "..") continue;
        struct stat es;
        if (fstatat(fd, entry.c_str(), &es, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISLNK(es.st_mode)) {
          auto target = RealPath(absl::StrCat(actual, "/", entry));
          if (!target.ok()) continue;  // dangling: the loader reports it if it needs it
          if (confined && !UnderAny(*target, roots_)) {
            bad = absl::PermissionDeniedError(
                absl::StrCat("model folder \"", shown, "\" holds \"", ipc::Abbreviate(entry, 64),
                             "\", a symlink to a path outside the model folders"));
            break;
          }
          if (stat(target->c_str(), &es) != 0) continue;
        }
        if (!S_ISREG(es.st_mode) && !S_ISDIR(es.st_mode)) {
          bad = absl::InvalidArgumentError(
              absl::StrCat("model folder \"", shown, "\" holds \"", ipc::Abbreviate(entry, 64),
                           "\", which is not a regular file or folder"));
          break;
        }
      }
      closedir(d);
      POLYKV_RETURN_IF_ERROR(bad);
    }
    opened.key.canonical = actual;
    opened.key.dev = st.st_dev;
    opened.key.ino = st.st_ino;
    opened.key.size = static_cast<uint64_t>(st.st_size);
    opened.key.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    opened.loader_path = access(FdPath(fd).c_str(), F_OK) == 0 ? FdPath(fd) : actual;
    return opened;
  }
  if (confined) {
    if (!any_inside) return absl::PermissionDeniedError(outside);
    return absl::NotFoundError(absl::StrCat("model \"", shown,
                                            "\" not found in the model folders (",
                                            absl::StrJoin(options_.models_dirs, ", "), ")"));
  }
  if (name[0] == '/') {
    return Status(last.code() == absl::StatusCode::kNotFound ? absl::StatusCode::kNotFound
                                                             : absl::StatusCode::kPermissionDenied,
                  absl::StrCat("model \"", shown, "\" cannot be opened: ", last.message()));
  }
  return absl::NotFoundError(absl::StrCat(
      "model \"", shown, "\" not found (searched: ", absl::StrJoin(options_.model_path, ", "),
      options_.model_path.empty() ? "" : ", ", "the daemon's working directory)"));
}

StatusOr<std::shared_ptr<PoolManager::ModelEntry>> PoolManager::GetModel(
    OpenedModel opened, const std::string& name, const ProgressFn& progress) {
  std::shared_ptr<ModelEntry> entry;
  {
    std::lock_guard<std::mutex> lock(models_mu_);
    auto& slot = models_[opened.key];
    if (!slot) {
      slot = std::make_shared<ModelEntry>();
      slot->key = opened.key;
    }
    slot->last_used = ++model_tick_;
    entry = slot;
  }
  std::lock_guard<std::mutex> lock(entry->load_mu);
  if (entry->loaded) return entry;
  if (shutdown_.load()) return absl::CancelledError("polykvd is shutting down");
  progress("load", 0, 1);
  auto t0 = Clock::now();
  StatusOr<std::unique_ptr<model::LlamaModel>> m = absl::InternalError("model loader did not run");
  try {
    m = options_.loader(opened.loader_path);
  } catch (const std::exception& e) {
    m = absl::InternalError(absl::StrCat("model loader threw: ", e.what()));
  }
  opened.fd.Reset();
  if (!m.ok()) {
    {
      std::lock_guard<std::mutex> models_lock(models_mu_);
      auto it = models_.find(opened.key);
      if (it != models_.end() && it->second == entry) models_.erase(it);  // retry next time
    }
    // The loader names the path it was given; show the requester's own name instead.
    std::string msg = absl::StrReplaceAll(m.status().message(), {{opened.loader_path, name}});
    return Status(m.status().code(), msg);
  }
  entry->model = *std::move(m);
  entry->bytes = ModelHeldBytes(*entry->model, &entry->mapped_bytes);
  entry->loaded = true;
  spdlog::info(
      "loaded model {} in {:.0f} ms ({} MiB of weights, {} MiB of them mapped from the "
      "file; fingerprint {})",
      opened.key.canonical, MsSince(t0), entry->bytes >> 20, entry->mapped_bytes >> 20,
      entry->model->fingerprint().substr(0, 16));
  progress("load", 1, 1);
  {
    std::lock_guard<std::mutex> models_lock(models_mu_);
    TrimModelCacheLocked(entry.get());
  }
  return entry;
}

void PoolManager::TrimModelCacheLocked(const ModelEntry* keep) {
  auto over = [&] {
    uint64_t bytes = 0;
    size_t count = 0;
    for (const auto& [key, e] : models_) {
      if (!e->loaded) continue;
      bytes += e->bytes;
      ++count;
    }
    return count > options_.model_cache_models ||
           (options_.model_cache_bytes > 0 && bytes > options_.model_cache_bytes);
  };
  while (over()) {
    // Least recently used entry that no create holds (use_count 1: only the cache).
    auto victim = models_.end();
    for (auto it = models_.begin(); it != models_.end(); ++it) {
      if (!it->second->loaded || it->second.get() == keep || it->second.use_count() > 1) continue;
      if (victim == models_.end() || it->second->last_used < victim->second->last_used) victim = it;
    }
    if (victim == models_.end()) return;  // everything else is in use: over the bound for now
    spdlog::info("model cache: dropped {} ({} MiB, least recently used)", victim->first.canonical,
                 victim->second->bytes >> 20);
    models_.erase(victim);
  }
}

ModelCacheStats PoolManager::model_cache() const {
  std::lock_guard<std::mutex> lock(models_mu_);
  ModelCacheStats s;
  s.capacity = static_cast<uint32_t>(options_.model_cache_models);
  for (const auto& [key, e] : models_) {
    if (!e->loaded) continue;
    s.bytes += e->bytes;
    s.mapped_bytes += e->mapped_bytes;
    ++s.models;
  }
  return s;
}

Status PoolManager::CheckServableModel(const ipc::PoolInfo& info, const std::string& what) {
  // The pool's model must be present (inside the model folders, when configured) and the
  // same file it was made with. The daemon itself asks: a trusted requester.
  auto opened = OpenModel(info.model, Requester{});
  if (!opened.ok()) {
    spdlog::error("{} needs model \"{}\", which is absent ({}); not served", what, info.model,
                  std::string(opened.status().message()));
    return absl::FailedPreconditionError(absl::StrCat(what, " needs model \"", info.model,
                                                      "\", which is absent (",
                                                      opened.status().message(), ")"));
  }
  const std::string canonical = opened->key.canonical;
  auto entry =
      GetModel(*std::move(opened), info.model, [](const std::string&, int64_t, int64_t) {});
  if (!entry.ok()) {
    spdlog::error("{} needs model {}, which does not load ({}); not served", what, canonical,
                  std::string(entry.status().message()));
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": its model does not load: ", entry.status().message()));
  }
  const std::string fingerprint = (*entry)->model->fingerprint();
  {
    // Only the fingerprint was needed: let the cache bound apply again.
    std::lock_guard<std::mutex> lock(models_mu_);
    entry->reset();
    TrimModelCacheLocked(nullptr);
  }
  if (fingerprint != info.model_fingerprint) {
    spdlog::error(
        "{} was made with model {} of fingerprint {}, but this daemon's file has "
        "fingerprint {}; not served",
        what, info.model, info.model_fingerprint.substr(0, 16), fingerprint.substr(0, 16));
    return absl::FailedPreconditionError(absl::StrCat(
        what, " was made with a different model file than ", canonical, " (fingerprint ",
        info.model_fingerprint.substr(0, 16), " vs ", fingerprint.substr(0, 16), ")"));
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon

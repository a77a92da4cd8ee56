// `polykv-cli ping` and `polykv-cli pools list|show|create|evict|export|import`: operate
// polykvd's pools through libpolykv_client (C++ wrapper); export/import move a pool between
// hosts as a pool file (ipc/pool_file.h). Human tables by default, --json for scripts.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "polykv/agent.h"
#include "polykv/client.hpp"
#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/pool_file.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/model/llama.h"
#include "polykv/model/prefill.h"
#include "polykv/pool_info_c.h"
#include "util/files.h"
#include "util/token_ids.h"

namespace polykv::cli {
namespace {

namespace pc = polykv::client;
using nlohmann::json;

// The --key-scale words, from the one key scale name table.
std::vector<std::string> KeyScaleWords() {
  std::vector<std::string> words;
  for (const ipc::KeyScaleName& n : ipc::kKeyScaleNames) words.push_back(n.name);
  return words;
}

/// Options shared by `ping` and every `pools` command.
struct CommonArgs {
  std::string endpoint;  // empty: $POLYKV_ENDPOINT or the default endpoint
  int timeout_ms = 5000;
  bool json = false;
};

struct CreateArgs {
  std::string model;
  std::string document;
  std::string token_ids;
  std::string codec;  // "" = k8v3, or a child's parent's codec
  std::string key_scale = "tensor";
  bool norm_correction = false;
  bool no_bos = false;
  int create_timeout_s = 600;
  std::string parent;       // a child pool (pool tree): the parent's id or unique prefix
  std::string chat_system;  // non-empty: frame the document as a system turn (chat template)
  bool chat_system_given = false;
};

/// The client library's status as a polykv::Status (the codes are the same numbers), for
/// FailWith.
Status FromClient(const pc::Status& status) {
  return Status(static_cast<absl::StatusCode>(status.code()), status.message());
}

/// True after reporting `result`'s error (FailWith); false when it holds a value.
template <typename T>
bool Failed(const pc::Result<T>& result) {
  if (result.ok()) return false;
  FailWith(FromClient(result.status()));
  return true;
}

void AddCommonOptions(CLI::App* app, CommonArgs* args) {
  AddDaemonOptions(app, &args->endpoint, &args->timeout_ms);
  app->add_flag("--json", args->json, "machine-readable JSON on stdout");
}

pc::Result<pc::Client> Connect(const CommonArgs& args) {
  return pc::Client::Connect(args.endpoint, args.timeout_ms);
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

std::string FormatTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

// The --json form of a pool: every field of the one list (POLYKV_POOL_INFO_FIELDS) under its
// wire name, with two groups nested as `pools` commands have always printed them (scripts
// read bytes.key_codes, fidelity.layers, ...): the bytes by part plus the total, and the
// reconstruction error recorded at build.
json InfoJson(const pc::PoolInfo& p) {
  struct Nested {
    const char* group;
    const char* key;
    const char* field;  // its top-level name, moved into the group
  };
  static constexpr Nested kNested[] = {
      {"bytes", "key_codes", "key_codes"},
      {"bytes", "key_scales", "key_scales"},
      {"bytes", "value_codes", "value_codes"},
      {"bytes", "value_norms", "value_norms"},
      {"bytes", "overhead", "overhead"},
      {"fidelity", "layers", "fidelity_layers"},
      {"fidelity", "key_rel_mse_mean", "key_rel_mse_mean"},
      {"fidelity", "key_rel_mse_max", "key_rel_mse_max"},
      {"fidelity", "value_rel_mse_mean", "value_rel_mse_mean"},
      {"fidelity", "value_rel_mse_max", "value_rel_mse_max"},
  };
  const ipc::PoolInfo info = pc::FromCPoolInfo(p.raw);
  json j = json::object();
  ipc::ForEachPoolInfoField(info, [&](const char* key, const auto& value) { j[key] = value; });
  for (const Nested& n : kNested) {
    j[n.group][n.key] = j[n.field];
    j.erase(n.field);
  }
  j["bytes"]["total"] = j["total_bytes"];  // also kept at the top level
  return j;
}

json PeersJson(const std::vector<polykv_peer_info>& peers) {
  json arr = json::array();
  for (const polykv_peer_info& p : peers) {
    json j = json::object();
    ipc::ForEachPeerStateField(p, [&](const char* key, const auto& value) { j[key] = value; });
    arr.push_back(std::move(j));
  }
  return arr;
}

/// Progress on stderr: a redrawn bar on a TTY, plain lines (one per stage change or 10%)
/// otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter() : tty_(isatty(STDERR_FILENO) == 1) {}
  ~ProgressPrinter() { Finish(); }
  void Update(const std::string& stage, int64_t done, int64_t total) {
    if (tty_) {
      if (!stage_.empty() && stage != stage_) std::fputc('\n', stderr);
      constexpr int kWidth = 30;
      int filled = total > 0 ? static_cast<int>(kWidth * std::min(done, total) / total) : 0;
      std::string bar(filled, '#');
      bar.resize(kWidth, ' ');
      double pct = total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 0;
      std::fprintf(stderr, "\r%-8s [%s] %lld/%lld (%.0f%%)", stage.c_str(), bar.c_str(),
                   static_cast<long long>(done), static_cast<long long>(total), pct);
      open_line_ = true;
    } else {
      int decile = total > 0 ? static_cast<int>(10 * std::min(done, total) / total) : 0;
      if (stage == stage_ && decile == last_decile_) return;
      std::fprintf(stderr, "%s %lld/%lld\n", stage.c_str(), static_cast<long long>(done),
                   static_cast<long long>(total));
      last_decile_ = decile;
    }
    stage_ = stage;
    std::fflush(stderr);
  }
  void Finish() {
    if (open_line_) std::fputc('\n', stderr);
    open_line_ = false;
  }

 private:
  bool tty_;
  bool open_line_ = false;
  std::string stage_;
  int last_decile_ = -1;
};

json DaemonJson(const pc::DaemonInfo& d, const std::string& endpoint) {
  return json{{"endpoint", endpoint},
              {"version", d.version},
              {"pid", d.pid},
              {"instance", d.instance},
              {"memory_used", d.memory_used},
              {"memory_cap", d.memory_cap},
              {"model_cache",
               {{"bytes", d.model_cache_bytes},
                {"mapped_bytes", d.model_cache_mapped_bytes},
                {"models", d.model_cache_models},
                {"capacity", d.model_cache_capacity}}},
              {"creates",
               {{"queued", d.creates_queued},
                {"running", d.creates_running},
                {"queue_capacity", d.create_queue_capacity}}}};
}

std::string CacheLine(const pc::DaemonInfo& d) {
  return "model cache " + std::to_string(d.model_cache_models) + " of " +
         std::to_string(d.model_cache_capacity) + " model(s), " + HumanBytes(d.model_cache_bytes) +
         (d.model_cache_mapped_bytes > 0
              ? " (" + HumanBytes(d.model_cache_mapped_bytes) + " mapped from the model files)"
              : std::string()) +
         "; creates " + std::to_string(d.creates_running) + " running, " +
         std::to_string(d.creates_queued) + " of " + std::to_string(d.create_queue_capacity) +
         " queued";
}

void RunPing(const CommonArgs& args) {
  auto client = Connect(args);
  if (Failed(client)) return;
  auto info = client->Ping();
  if (Failed(info)) return;
  auto peers = client->Peers();
  if (Failed(peers)) return;
  const std::string endpoint = args.endpoint.empty() ? "(default)" : args.endpoint;
  if (args.json) {
    json j = DaemonJson(*info, endpoint);
    j["peers"] = PeersJson(*peers);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "polykvd " << info->version << " (pid " << info->pid << ", instance "
              << info->instance.substr(0, 8) << ") at " << endpoint << ": pool memory "
              << HumanBytes(info->memory_used) << " used of "
              << (info->memory_cap ? HumanBytes(info->memory_cap) : std::string("no cap")) << "; "
              << CacheLine(*info) << "\n";
    for (const polykv_peer_info& p : *peers) {
      std::printf("  peer %-28s %-8s", p.endpoint, p.state);
      if (std::string(p.state) == "up") {
        std::printf(" instance %.8s, %u pool(s), rtt %.1f ms", p.instance, p.pools, p.rtt_ms);
      } else if (p.detail[0] != '\0') {
        std::printf(" %s", p.detail);
      }
      std::printf("\n");
    }
  }
}

/// A pool's state as the daemon reported it; "memory" from daemons older than the field.
std::string StateOf(const pc::PoolInfo& p) { return p.state.empty() ? "memory" : p.state; }

void RunList(const CommonArgs& args) {
  auto client = Connect(args);
  if (Failed(client)) return;
  auto pools = client->ListPools();
  if (Failed(pools)) return;
  auto daemon = client->Ping();
  if (Failed(daemon)) return;
  if (args.json) {
    json arr = json::array();
    for (const auto& p : *pools) arr.push_back(InfoJson(p));
    const std::string endpoint = args.endpoint.empty() ? "(default)" : args.endpoint;
    std::cout << json{{"pools", arr}, {"daemon", DaemonJson(*daemon, endpoint)}}.dump(2) << "\n";
    return;
  }
  if (pools->empty()) {
    std::cout << "no pools (" << CacheLine(*daemon) << ")\n";
    return;
  }
  // The pool tree: every child right under its parent, indented by its depth.
  std::map<std::string, std::vector<const pc::PoolInfo*>> children;
  std::set<std::string> ids;
  for (const auto& p : *pools) ids.insert(p.id);
  std::vector<const pc::PoolInfo*> roots;
  for (const auto& p : *pools) {
    if (!p.parent.empty() && ids.count(p.parent)) {
      children[p.parent].push_back(&p);
    } else {
      roots.push_back(&p);
    }
  }
  std::vector<std::pair<const pc::PoolInfo*, int>> rows;  // pool, depth
  std::function<void(const pc::PoolInfo*, int)> walk = [&](const pc::PoolInfo* p, int depth) {
    rows.emplace_back(p, depth);
    for (const pc::PoolInfo* c : children[p->id]) walk(c, depth + 1);
  };
  for (const pc::PoolInfo* r : roots) walk(r, 0);
  int width = 64;
  for (const auto& [p, depth] : rows) width = std::max(width, 64 + 3 * depth);
  size_t codec_width = 5;
  for (const auto& [p, depth] : rows) codec_width = std::max(codec_width, p->codec.size());
  const int cw = static_cast<int>(codec_width);
  std::printf("%-*s  %-*s  %-11s  %-4s  %8s  %6s  %11s  %6s  %6s  %s\n", width, "ID", cw, "CODEC",
              "STATE", "MEM", "TOKENS", "LAYERS", "SIZE", "RATIO", "LEASES", "ORIGIN");
  std::map<std::string, int> by_state;
  for (const auto& [p, depth] : rows) {
    std::string name;
    for (int d = 1; d < depth; ++d) name += "   ";
    if (depth > 0) name += "└─ ";
    name += p->id;
    // "└─ " is 3 columns but 7 bytes: pad by columns, not bytes.
    const int pad = width - (64 + 3 * depth);
    const std::string state = StateOf(*p);
    ++by_state[state];
    std::printf("%s%*s  %-*s  %-11s  %-4s  %8llu  %6u  %11s  %5.2fx  %6u  %s\n", name.c_str(), pad,
                "", cw, p->codec.empty() ? "-" : p->codec.c_str(), state.c_str(),
                p->backend.empty() ? "-" : p->backend.c_str(),
                static_cast<unsigned long long>(p->tokens), p->layers,
                HumanBytes(p->total_bytes).c_str(), p->effective_ratio, p->leases,
                p->origin.empty() ? "-" : p->origin.c_str());
  }
  for (const auto& [p, depth] : rows) {
    if (StateOf(*p) == "quarantined") {
      std::printf("quarantined %.16s: %s\n", p->id.c_str(), p->state_detail.c_str());
    }
  }
  std::printf(
      "%d in memory, %d on disk only (restored on first attach or create), %d quarantined\n",
      by_state["memory"], by_state["disk"], by_state["quarantined"]);
  std::printf("pool memory %s used of %s; %s\n", HumanBytes(daemon->memory_used).c_str(),
              daemon->memory_cap ? HumanBytes(daemon->memory_cap).c_str() : "no cap",
              CacheLine(*daemon).c_str());
}

// Hand-written rather than from the field list: rows are grouped, labelled and formatted for
// reading (sizes with units and shares of the total, times as dates, the fidelity on one line,
// the parent's positions as a range), not one field per row.
void PrintInfoHuman(const pc::PoolInfo& p, const std::vector<std::string>& chain) {
  auto row = [](const char* name, const std::string& value) {
    std::printf("  %-18s %s\n", name, value.c_str());
  };
  auto bytes_row = [&](const char* name, uint64_t b) {
    double pct =
        p.total_bytes ? 100.0 * static_cast<double>(b) / static_cast<double>(p.total_bytes) : 0;
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%14llu B  %11s  %5.1f%%", static_cast<unsigned long long>(b),
                  HumanBytes(b).c_str(), pct);
    row(name, buf);
  };
  std::printf("pool %s\n", p.id.c_str());
  const std::string state = StateOf(p);
  row("state", state == "memory"        ? std::string("memory (published)")
               : state == "disk"        ? "disk only (restored on the first attach or create)"
               : state == "quarantined" ? std::string("quarantined (never served)")
                                        : state);
  if (!p.state_detail.empty()) row(state == "quarantined" ? "why" : "file", p.state_detail);
  row("model", p.model);
  row("fingerprint", p.model_fingerprint);
  row("architecture", p.architecture.empty() ? "-" : p.architecture);
  row("tokenizer family", p.tokenizer_family.empty() ? "-" : p.tokenizer_family);
  row("codec", p.codec);
  row("backend", p.backend);
  row("origin", p.origin.empty() ? "-" : p.origin);
  row("tokens", std::to_string(p.tokens));
  if (!p.parent.empty()) {
    row("parent", p.parent);
    if (!chain.empty()) {
      std::string text;
      for (const std::string& c : chain) text += c.substr(0, 16) + " -> ";
      row("parent chain", text + p.id.substr(0, 16) + " (root first)");
    }
    row("positions", std::to_string(p.parent_tokens) + " .. " +
                         std::to_string(p.parent_tokens + p.tokens - 1) +
                         " (after the parent chain's " + std::to_string(p.parent_tokens) + ")");
  }
  row("layers", std::to_string(p.layers));
  row("kv_heads", std::to_string(p.kv_heads));
  row("head_dim", std::to_string(p.head_dim));
  std::printf("  bytes by part:\n");
  bytes_row("  key codes", p.key_codes_bytes);
  bytes_row("  key scales", p.key_scales_bytes);
  bytes_row("  value codes", p.value_codes_bytes);
  bytes_row("  value norms", p.value_norms_bytes);
  bytes_row("  overhead", p.overhead_bytes);
  bytes_row("  total", p.total_bytes);
  bytes_row("bf16 equivalent", p.bf16_bytes);
  char ratio[64];
  std::snprintf(ratio, sizeof(ratio), "%.3fx (bf16 / total, overhead included)", p.effective_ratio);
  row("effective ratio", ratio);
  row("leases", std::to_string(p.leases));
  row("created", FormatTime(p.created_unix_ms));
  char times[128];
  std::snprintf(times, sizeof(times), "prefill %.1f ms, encode %.1f ms, publish %.1f ms",
                p.prefill_ms, p.encode_ms, p.publish_ms);
  row("build time", times);
  if (p.fidelity_layers > 0) {
    char fid[160];
    std::snprintf(fid, sizeof(fid), "keys %.3g (max %.3g), values %.3g (max %.3g) over %u layers",
                  p.key_rel_mse_mean, p.key_rel_mse_max, p.value_rel_mse_mean, p.value_rel_mse_max,
                  p.fidelity_layers);
    row("rel. MSE at build", fid);
  } else {
    row("rel. MSE at build", "not recorded");
  }
}

void RunShow(const CommonArgs& args, const std::string& id) {
  auto client = Connect(args);
  if (Failed(client)) return;
  auto info = client->GetPoolInfo(id);  // the daemon resolves a unique prefix
  if (Failed(info)) return;
  // The parent chain, root first, from the daemon's list (pools in memory and on disk).
  std::vector<std::string> chain;
  if (!info->parent.empty()) {
    auto pools = client->ListPools();
    if (Failed(pools)) return;
    std::map<std::string, std::string> parent_of;
    for (const auto& p : *pools) parent_of[p.id] = p.parent;
    std::set<std::string> seen;
    for (std::string at = info->parent; !at.empty() && seen.insert(at).second;) {
      chain.insert(chain.begin(), at);
      auto it = parent_of.find(at);
      at = it == parent_of.end() ? std::string() : it->second;
    }
  }
  if (args.json) {
    json j = InfoJson(*info);
    j["parent_chain"] = chain;
    std::cout << j.dump(2) << "\n";
  } else {
    PrintInfoHuman(*info, chain);
  }
}

// Connects, runs `obtain` (a CreatePool or FetchPool) with a progress line on stderr, and
// prints the pool: its id (and `existed_note` on stderr when the daemon already had it), or
// with --json its info and `flag` = whether this call made it.
template <typename Obtain>
void RunObtain(const CommonArgs& args, const Obtain& obtain, const char* flag,
               const char* existed_note) {
  auto client = Connect(args);
  if (Failed(client)) return;
  ProgressPrinter printer;
  pc::Result<pc::CreatedPool> got =
      obtain(*client, [&](const std::string& stage, int64_t done, int64_t total) {
        printer.Update(stage, done, total);
      });
  printer.Finish();
  if (Failed(got)) return;
  if (args.json) {
    json j = InfoJson(got->info);
    j[flag] = got->created;
    std::cout << j.dump(2) << "\n";
  } else {
    if (!got->created) std::cerr << existed_note << "\n";
    std::cout << got->info.id << "\n";
  }
}

void RunCreate(const CommonArgs& args, const CreateArgs& c) {
  pc::CreateOptions opts;
  opts.model = c.model;
  opts.parent = c.parent;
  if (!c.token_ids.empty()) {
    auto ids = ParseTokenIds(c.token_ids, "--token-ids");
    if (!ids.ok()) return FailWith(ids.status());
    opts.token_ids = std::move(*ids);
  } else {
    auto text = ReadFileOrStdin(c.document, "document file");
    if (!text.ok()) return FailWith(text.status());
    if (text->empty() && c.document != "-") {
      return FailWith(absl::InvalidArgumentError("document file " + c.document + " is empty"));
    }
    opts.document = std::move(*text);
    if (c.chat_system_given) {
      // The system turn as the model's own chat template renders it (agent --chat renders
      // the question turns after it with the same template).
      auto tok = model::LoadTokenizer(c.model);
      if (!tok.ok()) return FailWith(tok.status());
      auto framed = client::ChatDocumentFor(tok->get(), opts.document, c.chat_system);
      if (!framed.ok()) return FailWith(framed.status());
      opts.document = std::move(*framed);
    }
  }
  opts.codec = c.codec;
  opts.key_scale = c.key_scale;
  opts.norm_correction = c.norm_correction;
  opts.add_bos = !c.no_bos;
  opts.timeout_ms = c.create_timeout_s * 1000;
  RunObtain(
      args,
      [&](pc::Client& client, const pc::ProgressFn& progress) {
        return client.CreatePool(opts, progress);
      },
      "created", "pool already existed");
}

void RunFetch(const CommonArgs& args, const std::string& id) {
  RunObtain(
      args,
      [&](pc::Client& client, const pc::ProgressFn& progress) {
        return client.FetchPool(id, progress);
      },
      "fetched", "the daemon already held the pool");
}

void RunEvict(const CommonArgs& args, const std::string& id, bool force) {
  auto client = Connect(args);
  if (Failed(client)) return;
  // EVICT carries the id as given: the daemon resolves a unique prefix (a pool kept only on
  // disk included). The full id is looked up only to be printed.
  std::string full = id;
  if (id.size() < 64) {
    if (auto info = client->GetPoolInfo(id); info.ok()) full = info->id;
  }
  pc::Status st = client->Evict(id, force);
  if (!st.ok()) return FailWith(FromClient(st));
  if (args.json) {
    std::cout << json{{"id", full}, {"evicted", true}, {"force", force}}.dump(2) << "\n";
  } else {
    std::cout << "evicted " << full << "\n";
  }
}

// Attaches pool `id` (full or a unique prefix, resolved by the daemon) and calls
// use(full_id, pool, base, size) with its read-only mapping while the lease is held; errors
// are reported.
template <typename F>
void WithMappedPool(const CommonArgs& args, const std::string& id, F&& use) {
  auto client = Connect(args);
  if (Failed(client)) return;
  auto pool = client->Attach(id);
  if (Failed(pool)) return;
  const void* base = nullptr;
  uint64_t size = 0;
  pc::Status st = pc::Status::FromC(polykv_pool_mapping(pool->get(), &base, &size));
  if (!st.ok()) return FailWith(FromClient(st));
  use(pool->info().id, *pool, base, size);
}

// Reads a pool file's manifest and its verified region into `region` (ipc/pool_file.h);
// a bad manifest is reported with `manifest_code`, a bad region with DATA_LOSS.
bool ReadVerifiedPoolFile(const std::string& file, absl::StatusCode manifest_code,
                          ipc::PoolFileManifest* manifest, std::vector<uint8_t>* region) {
  auto m = ipc::ReadPoolFileManifest(file);
  if (!m.ok()) {
    FailWith(Status(manifest_code, m.status().message()));
    return false;
  }
  region->assign(m->pool_bytes, 0);
  polykv::Status s = ipc::ReadPoolFileInto(file, *m, region->data(), region->size());
  if (!s.ok()) {
    FailWith(Status(absl::StatusCode::kDataLoss, s.message()));
    return false;
  }
  *manifest = *std::move(m);
  return true;
}

// `pools export ID FILE`: the pool's region as mapped, behind a manifest (ipc/pool_file.h).
void RunExport(const CommonArgs& args, const std::string& id, const std::string& file) {
  WithMappedPool(
      args, id, [&](const std::string& full, const auto& pool, const void* base, uint64_t size) {
        const pc::PoolInfo& p = pool.info();
        const ipc::PoolInfo info = pc::FromCPoolInfo(p.raw);  // leases: not written to the file
        polykv::Status w =
            ipc::WritePoolFile(file, info, base, std::min<uint64_t>(size, p.total_bytes));
        if (!w.ok()) {
          return FailWith(Status(absl::StatusCode::kInternal, w.message()));
        }
        if (args.json) {
          std::cout << json{{"id", full}, {"file", file}, {"bytes", p.total_bytes}}.dump(2) << "\n";
        } else {
          std::cout << "exported " << full << " to " << file << "\n";
        }
      });
}

// `pools verify ID | --file FILE [--model M]`: the payload checksum, then the reconstruction
// error recorded at build, measured again against a fresh prefill of the pool's own tokens
// with the model (the pool's model path unless --model is given).
struct VerifyArgs {
  std::string file;
  std::string model;
  int threads = 0;
  double tolerance = 0.02;
};

void VerifyRegion(const CommonArgs& args, const VerifyArgs& v, const std::string& what,
                  const void* base, uint64_t size, const std::string& recorded_model) {
  auto reader = ipc::PoolReader::Open(base, size, /*verify_payload=*/true);
  if (!reader.ok()) {
    return FailWith(
        Status(absl::StatusCode::kDataLoss, what + ": " + std::string(reader.status().message())));
  }
  const std::vector<ipc::LayerFidelity> recorded = reader->RecordedFidelity();
  std::string model_path = v.model.empty() ? recorded_model : v.model;
  // A child pool's K/V were computed after its parent chain: a prefill of its own tokens
  // alone is not its reference.
  const bool child = reader->params().parent_tokens > 0;
  const bool can_measure = !child && !model_path.empty() && access(model_path.c_str(), R_OK) == 0;
  std::vector<ipc::LayerFidelity> measured;
  std::string problem;
  if (can_measure && !recorded.empty()) {
    model::LoadOptions load;
    load.threads = v.threads;
    auto m = model::LlamaModel::Load(model_path, load);
    if (!m.ok()) {
      return FailWith(Status(absl::StatusCode::kFailedPrecondition,
                             "load " + model_path + ": " + std::string(m.status().message())));
    }
    if ((*m)->fingerprint() != reader->params().model_fingerprint) {
      return FailWith(Status(
          absl::StatusCode::kFailedPrecondition,
          model_path + " is not the model " + what + " was built with (fingerprints differ)"));
    }
    const std::vector<int32_t> ids = reader->TokenIds();
    auto pre = (*m)->Prefill(ids, 512, nullptr);
    if (!pre.ok()) {
      return FailWith(
          Status(absl::StatusCode::kInternal, "prefill: " + std::string(pre.status().message())));
    }
    for (uint32_t l = 0; l < reader->params().layers; ++l) {
      auto kv = model::ExportPrefilledLayer(*pre, l, /*to_host=*/true, kernels::DType::kF32);
      if (!kv.ok()) return FailWith(kv.status());
      auto f = reader->MeasureFidelity(l, kv->k(), kv->v(), kernels::DType::kF32);
      if (!f.ok()) {
        return FailWith(Status(absl::StatusCode::kInternal, f.status().message()));
      }
      measured.push_back(*f);
      const auto off = [&](double a, double b) {
        return std::fabs(a - b) > v.tolerance * b + 1e-7;
      };
      if (problem.empty() && (off(f->key_rel_mse, recorded[l].key_rel_mse) ||
                              off(f->value_rel_mse, recorded[l].value_rel_mse))) {
        char buf[200];
        std::snprintf(buf, sizeof(buf),
                      "layer %u: recorded rel. MSE keys %.4g values %.4g, measured now %.4g / %.4g",
                      l, recorded[l].key_rel_mse, recorded[l].value_rel_mse, f->key_rel_mse,
                      f->value_rel_mse);
        problem = buf;
      }
    }
  }
  if (args.json) {
    json layers = json::array();
    for (size_t l = 0; l < recorded.size(); ++l) {
      json row = {{"layer", l},
                  {"key_rel_mse", recorded[l].key_rel_mse},
                  {"value_rel_mse", recorded[l].value_rel_mse}};
      if (l < measured.size()) {
        row["measured_key_rel_mse"] = measured[l].key_rel_mse;
        row["measured_value_rel_mse"] = measured[l].value_rel_mse;
      }
      layers.push_back(row);
    }
    std::cout << json{{"pool", what},
                      {"payload_checksum", "ok"},
                      {"fidelity_recorded", !recorded.empty()},
                      {"fidelity_checked", !measured.empty()},
                      {"model", measured.empty() ? "" : model_path},
                      {"ok", problem.empty()},
                      {"layers", layers}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("%s: payload checksum ok\n", what.c_str());
    if (recorded.empty()) {
      std::printf("reconstruction error: not recorded in this pool\n");
    } else {
      std::printf("%5s %16s %16s%s\n", "layer", "key rel. MSE", "value rel. MSE",
                  measured.empty() ? "" : "   measured now (keys / values)");
      for (size_t l = 0; l < recorded.size(); ++l) {
        std::printf("%5zu %16.4g %16.4g", l, recorded[l].key_rel_mse, recorded[l].value_rel_mse);
        if (l < measured.size())
          std::printf("   %.4g / %.4g", measured[l].key_rel_mse, measured[l].value_rel_mse);
        std::printf("\n");
      }
      if (measured.empty())
        std::printf("recorded errors not re-measured: %s\n",
                    child ? "a child pool (its reference is a prefill after its parent chain)"
                    : model_path.empty() ? "pass --model"
                                         : ("cannot read " + model_path).c_str());
      else if (problem.empty())
        std::printf("recorded errors re-measured with %s: match (tolerance %.0f%%)\n",
                    model_path.c_str(), 100 * v.tolerance);
    }
  }
  if (!problem.empty()) FailWith(Status(absl::StatusCode::kDataLoss, what + ": " + problem));
}

void RunVerify(const CommonArgs& args, const std::string& id, const VerifyArgs& v) {
  if (!v.file.empty()) {
    ipc::PoolFileManifest m;
    std::vector<uint8_t> region;
    if (!ReadVerifiedPoolFile(v.file, absl::StatusCode::kDataLoss, &m, &region)) return;
    return VerifyRegion(args, v, v.file, region.data(), region.size(), m.info.model);
  }
  if (id.empty()) {
    return FailWith(Status(absl::StatusCode::kInvalidArgument, "give a pool ID or --file FILE"));
  }
  WithMappedPool(args, id,
                 [&](const std::string& full, const auto& pool, const void* base, uint64_t size) {
                   VerifyRegion(args, v, "pool " + full, base, size, pool.info().model);
                 });
}

// `pools import FILE [--state-dir DIR]`: verifies the file completely, then places it in
// polykvd's state folder (atomically); the daemon restores it on the first create or attach
// of its id (or at the next start with --preload).
void RunImport(const CommonArgs& args, const std::string& file, const std::string& state_dir) {
  ipc::PoolFileManifest manifest;
  std::vector<uint8_t> region;
  if (!ReadVerifiedPoolFile(file, absl::StatusCode::kInvalidArgument, &manifest, &region)) return;
  const std::string dest = state_dir + "/pools/" + manifest.info.id + ".pkv";
  polykv::Status s = ipc::WritePoolFile(dest, manifest.info, region.data(), region.size());
  if (!s.ok()) {
    return FailWith(Status(absl::StatusCode::kInternal,
                           std::string(s.message()) + " (is --state-dir polykvd's?)"));
  }
  if (args.json) {
    std::cout
        << json{{"id", manifest.info.id}, {"file", dest}, {"bytes", manifest.pool_bytes}}.dump(2)
        << "\n";
  } else {
    std::cout << "imported " << manifest.info.id << " (" << manifest.info.codec << ", "
              << manifest.info.tokens << " tokens, model " << manifest.info.model << ") into "
              << dest << "\n";
  }
}

}  // namespace

void RegisterPoolsCommands(CLI::App& app) {
  // Options live as long as the App (until main returns).
  static CommonArgs ping_args;
  static CommonArgs pools_args;
  static CreateArgs create_args;
  static std::string pool_id;
  static bool force = false;

  CLI::App* ping = app.add_subcommand("ping", "Check that polykvd answers; show its version");
  AddCommonOptions(ping, &ping_args);
  ping->callback([] { RunPing(ping_args); });

  CLI::App* pools = app.add_subcommand("pools", "List, show, create and evict shared pools");
  pools->require_subcommand(1);
  // Options given after the sub-subcommand (`pools list --json`) fall through to `pools`.
  AddCommonOptions(pools, &pools_args);
  pools->fallthrough();

  CLI::App* list = pools->add_subcommand("list", "List published pools");
  list->fallthrough();
  list->callback([] { RunList(pools_args); });

  CLI::App* show = pools->add_subcommand(
      "show", "Shape, bytes by part, ratio, leases and build times of one pool");
  show->fallthrough();
  show->add_option("ID", pool_id, "pool id (64 hex chars, or a unique prefix)")->required();
  show->callback([] { RunShow(pools_args, pool_id); });

  CLI::App* create = pools->add_subcommand(
      "create", "Prefill a document, compress its KV cache and publish it as a pool");
  create->fallthrough();
  create->add_option("--model", create_args.model,
                     "model path (.gguf or HF folder); with --parent, the parent's by default");
  create->add_option("--parent", create_args.parent,
                     "a child pool on top of this pool (id or unique prefix): holds only the "
                     "document's KV, prefilled after the parent chain's; takes its codec");
  auto* doc =
      create->add_option("--document", create_args.document, "document text file ('-' = stdin)");
  auto* ids =
      create->add_option("--token-ids", create_args.token_ids, "explicit token ids, e.g. 1,2,3");
  doc->excludes(ids);
  ids->excludes(doc);
  create->add_option("--codec", create_args.codec,
                     "pool codec: default (the measured default, k7c-v3-e4x3-nc-n16; the daemon's "
                     "choice when not given: k8v3 on CUDA), paper (k8t-v3), k8v2, k8v3, k8v4, none "
                     "or a spec k<4..8><t|h|c>-v<2..4>[-e<b>[x<n>]]"
                     "[-nc][-n16][-s<hex>]; a child pool: its parent's");
  create->add_option("--key-scale", create_args.key_scale, "int8 key scale granularity")
      ->check(CLI::IsMember(KeyScaleWords()));
  create->add_flag("--norm-correction", create_args.norm_correction,
                   "TurboQuant norm correction for values");
  create->add_flag("--no-bos", create_args.no_bos, "do not prepend BOS when tokenizing");
  auto* chat_system =
      create->add_option("--chat-system", create_args.chat_system,
                         "frame the document as a system turn \"INSTRUCTION\\n\\nDOCUMENT\" "
                         "rendered with the model's own chat template (ChatML when it has none), "
                         "for agents that ask with `agent --chat`");
  chat_system->excludes(ids);
  create
      ->add_option("--create-timeout-s", create_args.create_timeout_s,
                   "give up waiting for the daemon after this many seconds")
      ->check(CLI::Range(1, 86400));
  create->callback([chat_system] {
    if (create_args.model.empty() && create_args.parent.empty()) {
      return FailWith(Status(absl::StatusCode::kInvalidArgument,
                             "pools create needs --model PATH (or --parent ID)"));
    }
    if (create_args.document.empty() && create_args.token_ids.empty()) {
      return FailWith(Status(absl::StatusCode::kInvalidArgument,
                             "pools create needs --document FILE or --token-ids 1,2,3"));
    }
    create_args.chat_system_given = chat_system->count() > 0;
    if (create_args.chat_system_given && create_args.model.empty()) {
      return FailWith(Status(absl::StatusCode::kInvalidArgument,
                             "--chat-system needs --model (its chat template)"));
    }
    RunCreate(pools_args, create_args);
  });

  CLI::App* fetch = pools->add_subcommand(
      "fetch", "Replicate a pool from the daemon's peers (--peer) without attaching it");
  fetch->fallthrough();
  fetch->add_option("ID", pool_id, "pool id (64 hex chars, or a unique prefix of >= 8)")
      ->required();
  fetch->callback([] { RunFetch(pools_args, pool_id); });

  CLI::App* evict = pools->add_subcommand("evict", "Remove a pool (--force: even with leases)");
  evict->fallthrough();
  evict->add_option("ID", pool_id, "pool id (64 hex chars, or a unique prefix)")->required();
  evict->add_flag("--force", force, "evict even while agents hold leases");
  evict->callback([] { RunEvict(pools_args, pool_id, force); });

  static VerifyArgs verify_args;
  CLI::App* ver = pools->add_subcommand(
      "verify",
      "Check a pool (ID) or a pool file (--file): payload checksum, then the reconstruction error "
      "recorded at build, measured again against a fresh prefill of the pool's tokens");
  ver->fallthrough();
  ver->add_option("ID", pool_id, "pool id (64 hex chars, or a unique prefix)");
  ver->add_option("--file", verify_args.file, "a pool file (`pools export`) instead of a pool");
  ver->add_option("--model", verify_args.model,
                  "model to re-measure with (default: the path the pool was created with)");
  ver->add_option("--threads", verify_args.threads, "compute threads (0 = all cores)");
  ver->add_option("--tolerance", verify_args.tolerance,
                  "relative difference allowed between recorded and measured errors")
      ->capture_default_str();
  ver->callback([] { RunVerify(pools_args, pool_id, verify_args); });

  static std::string file, state_dir = "/var/lib/polykv";
  CLI::App* exp = pools->add_subcommand(
      "export", "Write a pool (its bytes as shared, plus a manifest) to FILE");
  exp->fallthrough();
  exp->add_option("ID", pool_id, "pool id (64 hex chars, or a unique prefix)")->required();
  exp->add_option("FILE", file, "pool file to write (atomically)")->required();
  exp->callback([] { RunExport(pools_args, pool_id, file); });
  CLI::App* imp = pools->add_subcommand(
      "import", "Verify a pool file and place it in polykvd's state folder (restored on use)");
  imp->fallthrough();
  imp->add_option("FILE", file, "pool file written by `pools export`")->required();
  imp->add_option("--state-dir", state_dir, "polykvd's --state-dir")->capture_default_str();
  imp->callback([] { RunImport(pools_args, file, state_dir); });
}

}  // namespace polykv::cli

// polykvd's metrics and their HTTP endpoint (see metrics.h).
#include "metrics.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pool_manager.h"
#include "pool_store.h"

namespace polykv::daemon {
namespace {

std::string Num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[40];
  for (int precision = 6; precision <= 17; ++precision) {  // shortest that reads back exactly
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void Family(std::string* out, const std::string& name, const std::string& type,
            const std::string& help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Sample(std::string* out, const std::string& name, const std::string& labels, double v) {
  absl::StrAppend(out, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ",
                  Num(v), "\n");
}

// Label values here are hex ids, codec/backend/type/code names: no escaping needed, but
// quotes and backslashes are escaped anyway (model paths).
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

void Histogram::Render(const std::string& name, std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    Sample(out, name + "_bucket", absl::StrCat("le=\"", Num(bounds_[i]), "\""),
           static_cast<double>(cum));
  }
  cum += counts_.back();
  Sample(out, name + "_bucket", "le=\"+Inf\"", static_cast<double>(cum));
  Sample(out, name + "_sum", "", sum_);
  Sample(out, name + "_count", "", static_cast<double>(count_));
}

Metrics::Metrics()
    : attach_({0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1}),
      create_({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}) {}

void Metrics::ObserveRequest(ipc::MessageType type, const ipc::Reply& reply, double seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[std::string(ipc::MessageTypeName(type))];
    if (!reply.ok) ++errors_[reply.code.empty() ? "UNKNOWN" : reply.code];
  }
  if (type == ipc::MessageType::kAttach) attach_.Observe(seconds);
  if (type == ipc::MessageType::kCreatePool) create_.Observe(seconds);
}

void Metrics::ObserveError(const std::string& code) {
  std::lock_guard<std::mutex> lock(mu_);
  ++errors_[code.empty() ? "UNKNOWN" : code];
}

void Metrics::AddPrefill(uint64_t tokens) {
  prefill_tokens_.fetch_add(tokens);
  prefills_.fetch_add(1);
}

void Metrics::AddCoalescedCreate() { coalesced_creates_.fetch_add(1); }

std::string Metrics::Render(const PoolManager& pools, const PoolStore* store) const {
  std::string out;
  const std::vector<ipc::PoolInfo> list = pools.List();
  const std::map<std::string, uint32_t> agents = pools.AgentsByPool();
  const std::string backend =
      absl::StrCat("backend=\"", ipc::PoolMemoryName(pools.backend()), "\"");

  Family(&out, "polykv_pools", "gauge", "Published pools.");
  Sample(&out, "polykv_pools", backend, static_cast<double>(list.size()));
  Family(&out, "polykv_memory_used_bytes", "gauge",
         "Bytes held by published and in-flight pools on the backend.");
  Sample(&out, "polykv_memory_used_bytes", backend, static_cast<double>(pools.memory_used()));
  Family(&out, "polykv_memory_cap_bytes", "gauge", "Memory cap of the backend (0 = unlimited).");
  Sample(&out, "polykv_memory_cap_bytes", backend, static_cast<double>(pools.memory_cap()));

  auto per_pool = [&](const std::string& name, const std::string& help, auto value_of) {
    Family(&out, name, "gauge", help);
    for (const auto& p : list) {
      Sample(&out, name, absl::StrCat("pool=\"", p.id, "\",codec=\"", Escape(p.codec), "\""),
             value_of(p));
    }
  };
  Family(&out, "polykv_pool_bytes", "gauge",
         "True bytes of a pool by part (key_codes, key_scales, value_codes, value_norms, "
         "overhead = header + token ids + alignment); they add up to total_bytes.");
  for (const auto& p : list) {
    const std::pair<const char*, uint64_t> parts[] = {{"key_codes", p.key_codes},
                                                      {"key_scales", p.key_scales},
                                                      {"value_codes", p.value_codes},
                                                      {"value_norms", p.value_norms},
                                                      {"overhead", p.overhead}};
    for (const auto& [part, bytes] : parts) {
      Sample(&out, "polykv_pool_bytes", absl::StrCat("pool=\"", p.id, "\",part=\"", part, "\""),
             static_cast<double>(bytes));
    }
  }
  per_pool("polykv_pool_total_bytes", "Bytes of a pool's whole region.",
           [](const ipc::PoolInfo& p) { return static_cast<double>(p.total_bytes); });
  per_pool("polykv_pool_bf16_bytes", "Bytes of the same KV cache held privately in bf16.",
           [](const ipc::PoolInfo& p) { return static_cast<double>(p.bf16_bytes); });
  per_pool("polykv_pool_effective_ratio", "bf16 bytes / total bytes (overhead included).",
           [](const ipc::PoolInfo& p) { return p.effective_ratio; });
  per_pool("polykv_pool_tokens", "Document tokens of a pool.",
           [](const ipc::PoolInfo& p) { return static_cast<double>(p.tokens); });
  per_pool("polykv_pool_leases", "Live leases on a pool.",
           [](const ipc::PoolInfo& p) { return static_cast<double>(p.leases); });
  per_pool("polykv_pool_agents", "Distinct agent processes holding live leases on a pool.",
           [&](const ipc::PoolInfo& p) {
             auto it = agents.find(p.id);
             return static_cast<double>(it == agents.end() ? 0 : it->second);
           });

  // Every pool the daemon knows (the published ones, the pool files not restored yet, the
  // quarantined files), by state, and one series per pool naming its state and parent.
  const std::vector<ipc::PoolInfo> catalog = pools.Catalog();
  std::map<std::string, uint64_t> by_state = {{"memory", 0}, {"disk", 0}, {"quarantined", 0}};
  for (const auto& p : catalog) ++by_state[p.state];
  Family(&out, "polykv_pools_by_state", "gauge",
         "Pools by state: memory (published), disk (a pool file only, restored on first use), "
         "quarantined (a corrupt pool file, never served).");
  for (const auto& [state, n] : by_state) {
    Sample(&out, "polykv_pools_by_state", absl::StrCat("state=\"", Escape(state), "\""),
           static_cast<double>(n));
  }
  Family(&out, "polykv_pool_state", "gauge",
         "1 per known pool, labelled with its state and its parent pool (\"\" for a root).");
  for (const auto& p : catalog) {
    Sample(&out, "polykv_pool_state",
           absl::StrCat("pool=\"", Escape(p.id), "\",state=\"", Escape(p.state), "\",parent=\"",
                        Escape(p.parent), "\""),
           1);
  }

  Family(&out, "polykv_persisted_pools", "gauge", "Pool files in the state folder.");
  Sample(&out, "polykv_persisted_pools", "", store ? static_cast<double>(store->count()) : 0);
  Family(&out, "polykv_persisted_bytes", "gauge", "Bytes of the pool files in the state folder.");
  Sample(&out, "polykv_persisted_bytes", "", store ? static_cast<double>(store->bytes()) : 0);
  Family(&out, "polykv_persist_budget_bytes", "gauge", "Disk budget of pool files (0 = none).");
  Sample(&out, "polykv_persist_budget_bytes", "",
         store ? static_cast<double>(store->budget_bytes()) : 0);
  Family(&out, "polykv_pool_files_quarantined_total", "counter",
         "Corrupt or truncated pool files moved to quarantine.");
  Sample(&out, "polykv_pool_files_quarantined_total", "",
         store ? static_cast<double>(store->quarantined()) : 0);
  Family(&out, "polykv_pool_files_budget_evicted_total", "counter",
         "Pool files removed (least recently used) to stay within the disk budget.");
  Sample(&out, "polykv_pool_files_budget_evicted_total", "",
         store ? static_cast<double>(store->evicted_for_budget()) : 0);
  Family(&out, "polykv_pools_restored_total", "counter",
         "Pools published from the state folder instead of a prefill.");
  Sample(&out, "polykv_pools_restored_total", "", static_cast<double>(pools.restored_count()));
  Family(&out, "polykv_pools_replicated_total", "counter",
         "Pools published from a peer daemon (UCX transfer) instead of a prefill.");
  Sample(&out, "polykv_pools_replicated_total", "", static_cast<double>(pools.replicated_count()));

  Family(&out, "polykv_prefill_tokens_total", "counter", "Tokens prefilled by pool creates.");
  Sample(&out, "polykv_prefill_tokens_total", "", static_cast<double>(prefill_tokens_.load()));
  Family(&out, "polykv_prefills_total", "counter",
         "Creates that ran the model (restores, replicas and joined creates run none).");
  Sample(&out, "polykv_prefills_total", "", static_cast<double>(prefills_.load()));
  Family(&out, "polykv_creates_coalesced_total", "counter",
         "CREATE_POOLs that joined an identical create in flight (single flight) instead of "
         "taking a create queue slot.");
  Sample(&out, "polykv_creates_coalesced_total", "",
         static_cast<double>(coalesced_creates_.load()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    Family(&out, "polykv_requests_total", "counter", "Answered requests by type.");
    for (const auto& [type, n] : requests_) {
      Sample(&out, "polykv_requests_total", absl::StrCat("type=\"", type, "\""),
             static_cast<double>(n));
    }
    Family(&out, "polykv_errors_total", "counter", "Error replies by status code.");
    for (const auto& [code, n] : errors_) {
      Sample(&out, "polykv_errors_total", absl::StrCat("code=\"", code, "\""),
             static_cast<double>(n));
    }
  }
  Family(&out, "polykv_attach_duration_seconds", "histogram",
         "Time to answer ATTACH (including a lazy restore from the state folder).");
  attach_.Render("polykv_attach_duration_seconds", &out);
  Family(&out, "polykv_create_duration_seconds", "histogram",
         "Time to answer CREATE_POOL (tokenize, prefill, encode, persist, publish).");
  create_.Render("polykv_create_duration_seconds", &out);
  return out;
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                              std::function<std::string()> render) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen \"", listen, "\" must be HOST:PORT, e.g. 127.0.0.1:9464"));
  }
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->host_ = listen.substr(0, colon);
  if (m->host_.size() > 2 && m->host_.front() == '[' && m->host_.back() == ']') {
    m->host_ = m->host_.substr(1, m->host_.size() - 2);
  }
  m->server_ = std::make_unique<httplib::Server>();
  m->server_->new_task_queue = [] { return new httplib::ThreadPool(1); };
  m->server_->Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    try {
      res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(absl::StrCat("metrics: ", e.what(), "\n"), "text/plain");
    }
  });
  m->port_ = port == 0 ? m->server_->bind_to_any_port(m->host_)
                       : (m->server_->bind_to_port(m->host_, port) ? port : -1);
  if (m->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " for metrics"));
  }
  httplib::Server* s = m->server_.get();
  m->thread_ = std::thread([s] { s->listen_after_bind(); });
  // stop() is a no-op until the loop runs, so the destructor must not race its start.
  for (int i = 0; i < 2000 && !s->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  spdlog::info("metrics: serving http://{}:{}/metrics", m->host_, m->port_);
  return m;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace polykv::daemon

// libpolykv_client: the C API of client.h over ZeroMQ (Lazy Pirate DEALER), POSIX shm /
// CUDA IPC read-only mappings and ipc::PoolReader, with one lease-renewal thread per pool.
#include "polykv/client.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "client_channel.h"
#include "client_device.h"
#include "client_internal.h"
#include "polykv/ipc/codec_spec.h"
#include "polykv/ipc/cuda_ipc.h"
#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/sealed_region.h"
#include "polykv/ipc/shm_region.h"
#include "polykv/pool_info_c.h"
#include "polykv/status.h"

namespace polykv::client {

thread_local std::string g_last_error;

polykv_status ToC(const Status& s) {
  if (s.ok()) return POLYKV_OK;
  g_last_error = std::string(s.message());
  int code = static_cast<int>(s.code());
  if (code < 0 || code > POLYKV_DATA_LOSS) return POLYKV_UNKNOWN;
  return static_cast<polykv_status>(code);
}

polykv_status Fail(polykv_status code, std::string message) {
  g_last_error = std::move(message);
  return code;
}

}  // namespace polykv::client

namespace {

using polykv::Status;
using polykv::StatusOr;
using polykv::client::Channel;
using polykv::client::Clock;
using polykv::client::Fail;
using polykv::client::g_last_error;
using polykv::client::Guarded;
using polykv::client::kDefaultTimeoutMs;
using polykv::client::kTries;
using polykv::client::ToC;
namespace ipc = polykv::ipc;
namespace kernels = polykv::kernels;

constexpr int kDefaultCreateTimeoutMs = 600000;  // 10 min bound for CREATE_POOL
// A create fails this long after the daemon's last word (it sends one every
// ipc::kHeartbeatMs while the create is queued or running).
constexpr int kCreateSilenceMs = 5 * ipc::kHeartbeatMs;
constexpr int64_t kMinRenewIntervalMs = 20;

// A string into a fixed C array: cut to fit, always NUL-terminated.
template <size_t N>
void CopyString(char (&dst)[N], const std::string& src) {
  polykv::client::pool_info_c_internal::ToC(dst, src);
}

// ---- out-structs that grow (a leading uint32_t struct_size, members only appended) ----

// The first polykv_pool_info / polykv_peer_info with struct_size ended with these members.
constexpr size_t kPoolInfoV1Bytes =
    offsetof(polykv_pool_info, origin) + sizeof(polykv_pool_info::origin);
constexpr size_t kPeerInfoV1Bytes =
    offsetof(polykv_peer_info, last_seen_unix_ms) + sizeof(polykv_peer_info::last_seen_unix_ms);

// OK when the `struct_size` of argument `arg` of `fn` (a `type`) lies in [v1_bytes,
// our_bytes]; else kInvalidArgument "<fn>: <arg>->struct_size is N, ..." with the sizes.
Status CheckStructSize(const char* fn, const char* arg, const char* type, uint32_t struct_size,
                       size_t v1_bytes, size_t our_bytes) {
  if (struct_size < v1_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": ", arg, "->struct_size is ", struct_size, ", smaller than the first ", type, " (",
        v1_bytes, " bytes): set it to sizeof(", type, "), e.g. with ", type, "_init()"));
  }
  if (struct_size > our_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": ", arg, "->struct_size is ", struct_size, ", larger than this library's ", type,
        " (", our_bytes, " bytes): the program was built against a newer client.h"));
  }
  return Status();
}

Status CheckPoolInfoSize(const char* fn, const char* arg, const polykv_pool_info* info) {
  return CheckStructSize(fn, arg, "polykv_pool_info", info->struct_size, kPoolInfoV1Bytes,
                         sizeof(polykv_pool_info));
}

// Writes the first `struct_size` bytes of `full` (the members of the caller's version, with
// struct_size kept) to `dst`.
template <typename CStruct>
void WriteSized(const CStruct& full, uint32_t struct_size, void* dst) {
  CStruct sized = full;
  sized.struct_size = struct_size;
  std::memcpy(dst, &sized, struct_size);
}

// `p` into a caller's polykv_pool_info of `struct_size` bytes at `dst` (size checked).
void WritePoolInfo(const ipc::PoolInfo& p, uint32_t struct_size, void* dst) {
  polykv_pool_info full;
  polykv::client::ToCPoolInfo(p, &full);
  WriteSized(full, struct_size, dst);
}

void ToCInfo(const ipc::PoolInfo& p, polykv_pool_info* out) {
  WritePoolInfo(p, out->struct_size, out);
}

std::string Hex(const uint8_t* bytes, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[bytes[i] >> 4]);
    s.push_back(kDigits[bytes[i] & 15]);
  }
  return s;
}

Status CheckPoolId(const char* pool_id) {
  if (pool_id == nullptr || *pool_id == '\0') {
    return absl::InvalidArgumentError("pool id is empty");
  }
  size_t n = std::strlen(pool_id);
  if (n > 64)
    return absl::InvalidArgumentError(absl::StrCat("pool id is ", n, " characters, over 64"));
  return Status();
}

// client->Call(req) for a request naming req.pool_id: the daemon's kNotFound as "unknown pool
// <id> (daemon: ...)", anything else as it is.
StatusOr<ipc::Reply> CallForPool(polykv_client* client, const ipc::Request& req) {
  StatusOr<ipc::Reply> reply = client->Call(req);
  if (!reply.ok() && reply.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(
        absl::StrCat("unknown pool ", req.pool_id, " (daemon: ", reply.status().message(), ")"));
  }
  return reply;
}

}  // namespace

/// OK while the lease is valid; otherwise the reason (sets nothing).
std::pair<polykv_status, std::string> polykv_pool::LeaseState() const {
  std::lock_guard<std::mutex> lock(mu);
  if (lease_code != POLYKV_OK) return {lease_code, lease_message};
  if (Clock::now() >= lease_valid_until) {
    return {POLYKV_FAILED_PRECONDITION,
            absl::StrCat("lease on pool ", info.id,
                         " expired: not renewed in time (is the daemon running?)",
                         lease_message.empty() ? "" : " last renewal error: ", lease_message)};
  }
  return {POLYKV_OK, ""};
}

void polykv_pool::RenewLoop() {
  const int64_t interval_ms = std::max<int64_t>(kMinRenewIntervalMs, lease_ms / 3);
  const int try_timeout = static_cast<int>(
      std::max<int64_t>(10, std::min<int64_t>(timeout_ms, std::max<int64_t>(interval_ms / 2, 10))));
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    cv.wait_for(lock, std::chrono::milliseconds(interval_ms), [this] { return stop; });
    if (stop) return;
    if (lease_code != POLYKV_OK) return;  // evicted / expired: nothing left to renew
    lock.unlock();
    ipc::Request req;
    req.type = ipc::MessageType::kRenew;
    req.lease_id = lease_id;
    req.pool_id = info.id;
    req.client_pid = static_cast<uint32_t>(getpid());
    const auto sent = Clock::now();
    StatusOr<ipc::Reply> reply = [&]() -> StatusOr<ipc::Reply> {
      try {
        return channel->Call(req, try_timeout, 2, {}, &cancel);
      } catch (const std::exception& e) {
        return absl::UnavailableError(absl::StrCat("ZeroMQ error: ", e.what()));
      }
    }();
    lock.lock();
    if (stop) return;
    if (!reply.ok()) {  // daemon unreachable: keep the lease until it runs out locally
      lease_message = std::string(reply.status().message());
      if (Clock::now() >= lease_valid_until) {
        lease_code = POLYKV_FAILED_PRECONDITION;
        lease_message =
            absl::StrCat("lease on pool ", info.id,
                         " expired: the daemon did not answer renewals (", lease_message, ")");
      }
      continue;
    }
    Status st = ipc::ReplyStatus(*reply);
    if (!instance.empty() && !reply->instance.empty() && reply->instance != instance) {
      // Another daemon answers on the endpoint: ours (and every lease it granted) is gone.
      lease_code = POLYKV_NOT_FOUND;
      lease_message =
          absl::StrCat("pool ", info.id, " is gone: polykvd restarted (instance ",
                       instance.substr(0, 8), " -> ", reply->instance.substr(0, 8), ")");
      continue;
    }
    if (st.ok()) {
      int64_t ms = reply->lease_ms > 0 ? reply->lease_ms : lease_ms;
      lease_valid_until = sent + std::chrono::milliseconds(ms);
      lease_message.clear();
    } else if (st.code() == absl::StatusCode::kNotFound) {
      lease_code = POLYKV_NOT_FOUND;
      lease_message = absl::StrCat("pool ", info.id, " was evicted (daemon: ", st.message(), ")");
    } else if (st.code() == absl::StatusCode::kFailedPrecondition) {
      lease_code = POLYKV_FAILED_PRECONDITION;
      lease_message =
          absl::StrCat("lease on pool ", info.id, " expired (daemon: ", st.message(), ")");
    } else {
      lease_message =
          absl::StrCat("renewal of the lease on pool ", info.id, " failed: ", st.ToString());
    }
  }
}

extern "C" {

const char* polykv_status_string(polykv_status status) {
  switch (status) {
    case POLYKV_OK:
      return "OK";
    case POLYKV_CANCELLED:
      return "CANCELLED";
    case POLYKV_UNKNOWN:
      return "UNKNOWN";
    case POLYKV_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case POLYKV_DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case POLYKV_NOT_FOUND:
      return "NOT_FOUND";
    case POLYKV_ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case POLYKV_PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case POLYKV_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case POLYKV_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case POLYKV_ABORTED:
      return "ABORTED";
    case POLYKV_OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case POLYKV_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case POLYKV_INTERNAL:
      return "INTERNAL";
    case POLYKV_UNAVAILABLE:
      return "UNAVAILABLE";
    case POLYKV_DATA_LOSS:
      return "DATA_LOSS";
  }
  return "UNKNOWN_STATUS";
}

const char* polykv_last_error(void) { return g_last_error.c_str(); }

void polykv_create_options_init(polykv_create_options* opts) {
  if (opts == nullptr) return;
  std::memset(opts, 0, sizeof(*opts));
  opts->struct_version = POLYKV_CREATE_OPTIONS_VERSION;
  opts->codec = nullptr;  // k8v3, or a child's parent's codec
  opts->key_scale = "tensor";
  opts->add_bos = 1;
  opts->timeout_ms = kDefaultCreateTimeoutMs;
}

polykv_status polykv_connect(const char* endpoint, int timeout_ms, polykv_client** out) {
  if (out == nullptr) return Fail(POLYKV_INVALID_ARGUMENT, "polykv_connect: out is NULL");
  *out = nullptr;
  return Guarded("polykv_connect", [&]() -> Status {
    auto client = std::make_unique<polykv_client>();
    client->endpoint = (endpoint && *endpoint) ? std::string(endpoint) : ipc::DefaultEndpoint();
    client->timeout_ms = timeout_ms > 0 ? timeout_ms : kDefaultTimeoutMs;
    client->context = std::make_shared<zmq::context_t>(1);
    client->channel = std::make_unique<Channel>(client->context, client->endpoint);
    ipc::Request ping;
    ping.type = ipc::MessageType::kPing;
    POLYKV_RETURN_IF_ERROR(client->Call(ping).status());
    *out = client.release();
    return Status();
  });
}

void polykv_disconnect(polykv_client* client) {
  if (client == nullptr) return;
  try {
    client->channel.reset();
    delete client;
  } catch (...) {
  }
}

polykv_status polykv_ping(polykv_client* client, polykv_daemon_info* out) {
  if (client == nullptr) return Fail(POLYKV_INVALID_ARGUMENT, "polykv_ping: client is NULL");
  return Guarded("polykv_ping", [&]() -> Status {
    ipc::Request req;
    req.type = ipc::MessageType::kPing;
    POLYKV_ASSIGN_OR_RETURN(ipc::Reply reply, client->Call(req));
    if (out != nullptr) {
      std::memset(out, 0, sizeof(*out));
      CopyString(out->version, reply.daemon_version);
      out->pid = reply.daemon_pid;
      out->memory_used = reply.memory_used;
      out->memory_cap = reply.memory_cap;
    }
    return Status();
  });
}

polykv_status polykv_list_pools(polykv_client* client, polykv_pool_info* infos, size_t capacity,
                                size_t* count) {
  if (client == nullptr) return Fail(POLYKV_INVALID_ARGUMENT, "polykv_list_pools: client is NULL");
  if (infos == nullptr && capacity > 0) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_list_pools: infos is NULL but capacity > 0");
  }
  // Every element has the caller's version of the struct: infos[0].struct_size is the stride.
  const uint32_t stride = capacity > 0 ? infos[0].struct_size : 0;
  return Guarded("polykv_list_pools", [&]() -> Status {
    if (capacity > 0) {
      POLYKV_RETURN_IF_ERROR(CheckPoolInfoSize("polykv_list_pools", "infos[0]", infos));
    }
    ipc::Request req;
    req.type = ipc::MessageType::kList;
    POLYKV_ASSIGN_OR_RETURN(ipc::Reply reply, client->Call(req));
    for (size_t i = 0; i < reply.pools.size() && i < capacity; ++i) {
      WritePoolInfo(reply.pools[i], stride, reinterpret_cast<char*>(infos) + i * stride);
    }
    if (count) *count = reply.pools.size();
    return Status();
  });
}

polykv_status polykv_pool_info_by_id(polykv_client* client, const char* pool_id,
                                     polykv_pool_info* out) {
  if (client == nullptr || out == nullptr) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_info_by_id: client or out is NULL");
  }
  return Guarded("polykv_pool_info_by_id", [&]() -> Status {
    POLYKV_RETURN_IF_ERROR(CheckPoolInfoSize("polykv_pool_info_by_id", "out", out));
    POLYKV_RETURN_IF_ERROR(CheckPoolId(pool_id));
    ipc::Request req;
    req.type = ipc::MessageType::kStats;
    req.pool_id = pool_id;
    StatusOr<ipc::Reply> reply = CallForPool(client, req);
    if (!reply.ok()) return reply.status();
    if (reply->pool && reply->pool->id == pool_id) {
      ToCInfo(*reply->pool, out);
      return Status();
    }
    for (const ipc::PoolInfo& p : reply->pools) {
      if (p.id == pool_id) {
        ToCInfo(p, out);
        return Status();
      }
    }
    if (reply->pool && !reply->pool->id.empty()) {  // prefix or alias resolved by the daemon
      ToCInfo(*reply->pool, out);
      return Status();
    }
    return absl::NotFoundError(absl::StrCat("unknown pool ", pool_id));
  });
}

namespace {

// CREATE_POOL with the document given as (`document`, `document_size`) bytes, or none.
polykv_status CreatePool(polykv_client* client, const polykv_create_options* opts,
                         const char* document, size_t document_size, polykv_progress_fn progress,
                         void* user, polykv_pool_info* out, int* created, const char* what) {
  return Guarded(what, [&]() -> Status {
    if (out != nullptr) POLYKV_RETURN_IF_ERROR(CheckPoolInfoSize(what, "out", out));
    if (opts->struct_version != 1 && opts->struct_version != POLYKV_CREATE_OPTIONS_VERSION) {
      return absl::InvalidArgumentError(absl::StrCat(
          "polykv_create_options.struct_version is ", opts->struct_version, ", expected 1 or ",
          POLYKV_CREATE_OPTIONS_VERSION, " (call polykv_create_options_init)"));
    }
    const char* parent =
        opts->struct_version >= 2 && opts->parent != nullptr && *opts->parent != '\0' ? opts->parent
                                                                                      : nullptr;
    if (parent == nullptr && (opts->model == nullptr || *opts->model == '\0')) {
      return absl::InvalidArgumentError("create: model path is empty");
    }
    const bool has_doc = document != nullptr && document_size > 0;
    const bool has_ids = opts->token_count > 0;
    if (has_ids && opts->token_ids == nullptr) {
      return absl::InvalidArgumentError("create: token_count > 0 but token_ids is NULL");
    }
    if (has_doc == has_ids) {
      return absl::InvalidArgumentError(
          has_doc ? "create: give either a document or token ids, not both"
                  : "create: no document text and no token ids given");
    }
    ipc::Request req;
    req.type = ipc::MessageType::kCreatePool;
    req.model = opts->model != nullptr ? opts->model : "";
    if (parent != nullptr) req.parent = parent;
    if (has_doc) {
      req.document.assign(document, document_size);  // every byte, NULs included
      // Refuse, rather than alter, text the protocol cannot carry (JSON strings are UTF-8).
      POLYKV_RETURN_IF_ERROR(ipc::ValidateUtf8(req.document, "create: the document"));
    }
    if (has_ids) req.token_ids.assign(opts->token_ids, opts->token_ids + opts->token_count);
    req.add_bos = opts->add_bos != 0;
    // "" = the daemon's default codec (a child: its parent's).
    req.codec = opts->codec != nullptr ? opts->codec : "";
    // Presets and specs (polykv/ipc/codec_spec.h) are checked here, with the daemon's rules.
    if (!req.codec.empty()) {
      auto spec = ipc::ParseCodecSpec(req.codec);
      if (!spec.ok())
        return Status(spec.status().code(), absl::StrCat("create: ", spec.status().message()));
    }
    req.key_scale = opts->key_scale ? opts->key_scale : "tensor";
    if (!ipc::ParseKeyScaleName(req.key_scale)) {
      return absl::InvalidArgumentError(absl::StrCat("create: unknown key scale \"",
                                                     ipc::Abbreviate(req.key_scale, 32),
                                                     "\" (expected tensor, head or channel)"));
    }
    req.norm_correction = opts->norm_correction != 0;
    // Always ask for progress: the daemon then sends heartbeats, and silence means trouble.
    req.progress = true;
    req.client_pid = static_cast<uint32_t>(getpid());
    const int timeout = opts->timeout_ms > 0 ? opts->timeout_ms : kDefaultCreateTimeoutMs;
    std::function<void(const ipc::Reply&)> on_progress;
    if (progress) {
      on_progress = [&](const ipc::Reply& p) { progress(p.stage.c_str(), p.done, p.total, user); };
    }
    StatusOr<ipc::Reply> reply;
    {
      std::lock_guard<std::mutex> lock(client->mu);
      // Sent once: a create can run for minutes, and resending would queue a second one.
      reply = client->channel->CallStreaming(req, timeout, kCreateSilenceMs, on_progress);
    }
    if (!reply.ok()) {
      if (reply.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::DeadlineExceededError(absl::StrCat(
            reply.status().message(),
            " (if the daemon is still working, `polykv-cli pools list` shows the pool once "
            "published)"));
      }
      return reply.status();
    }
    POLYKV_RETURN_IF_ERROR(ipc::ReplyStatus(*reply));
    if (!reply->pool) return absl::InternalError("CREATE_POOL reply carries no pool description");
    if (out) ToCInfo(*reply->pool, out);
    if (created) *created = reply->created ? 1 : 0;
    return Status();
  });
}

}  // namespace

polykv_status polykv_create_pool(polykv_client* client, const polykv_create_options* opts,
                                 polykv_progress_fn progress, void* user, polykv_pool_info* out,
                                 int* created) {
  if (client == nullptr || opts == nullptr) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_create_pool: client or opts is NULL");
  }
  const char* doc = opts->document;
  return CreatePool(client, opts, doc, doc != nullptr ? std::strlen(doc) : 0, progress, user, out,
                    created, "polykv_create_pool");
}

polykv_status polykv_create_pool_from_text(polykv_client* client, const polykv_create_options* opts,
                                           const char* document, size_t document_size,
                                           polykv_progress_fn progress, void* user,
                                           polykv_pool_info* out, int* created) {
  if (client == nullptr || opts == nullptr) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_create_pool_from_text: client or opts is NULL");
  }
  if (document == nullptr && document_size > 0) {
    return Fail(POLYKV_INVALID_ARGUMENT,
                "polykv_create_pool_from_text: document is NULL but document_size > 0");
  }
  if (opts->document != nullptr) {
    return Fail(POLYKV_INVALID_ARGUMENT,
                "polykv_create_pool_from_text: opts->document must be NULL (the document is "
                "passed as document/document_size)");
  }
  return CreatePool(client, opts, document, document_size, progress, user, out, created,
                    "polykv_create_pool_from_text");
}

polykv_status polykv_daemon_get_status(polykv_client* client, polykv_daemon_status* out) {
  if (client == nullptr || out == nullptr) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_daemon_get_status: client or out is NULL");
  }
  // Callers built against the header before model_cache_mapped_bytes pass a smaller struct:
  // they get every field their struct has.
  constexpr size_t kMinSize = offsetof(polykv_daemon_status, model_cache_mapped_bytes);
  if (out->struct_size < kMinSize || out->struct_size > sizeof(polykv_daemon_status)) {
    return Fail(
        POLYKV_INVALID_ARGUMENT,
        absl::StrCat("polykv_daemon_get_status: out->struct_size is ", out->struct_size,
                     ", expected sizeof(polykv_daemon_status) = ", sizeof(polykv_daemon_status)));
  }
  return Guarded("polykv_daemon_get_status", [&]() -> Status {
    ipc::Request req;
    req.type = ipc::MessageType::kPing;
    POLYKV_ASSIGN_OR_RETURN(ipc::Reply reply, client->Call(req));
    const uint32_t size = out->struct_size;
    polykv_daemon_status full;
    std::memset(&full, 0, sizeof(full));
    full.struct_size = size;
    CopyString(full.version, reply.daemon_version);
    CopyString(full.instance, reply.instance);
    full.pid = reply.daemon_pid;
#define POLYKV_DAEMON_FIGURE_TO_C(name) \
  polykv::client::pool_info_c_internal::ToC(full.name, reply.name);
    POLYKV_DAEMON_FIGURE_FIELDS(POLYKV_DAEMON_FIGURE_TO_C)
#undef POLYKV_DAEMON_FIGURE_TO_C
    std::memcpy(out, &full, size);
    return Status();
  });
}

polykv_status polykv_daemon_peers(polykv_client* client, polykv_peer_info* peers, size_t capacity,
                                  size_t* count) {
  if (client == nullptr || count == nullptr || (capacity > 0 && peers == nullptr)) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_daemon_peers: client, count or peers is NULL");
  }
  // As polykv_list_pools: peers[0].struct_size is every element's size (the stride).
  const uint32_t stride = capacity > 0 ? peers[0].struct_size : 0;
  return Guarded("polykv_daemon_peers", [&]() -> Status {
    if (capacity > 0) {
      POLYKV_RETURN_IF_ERROR(CheckStructSize("polykv_daemon_peers", "peers[0]", "polykv_peer_info",
                                             stride, kPeerInfoV1Bytes, sizeof(polykv_peer_info)));
    }
    ipc::Request req;
    req.type = ipc::MessageType::kPing;
    POLYKV_ASSIGN_OR_RETURN(ipc::Reply reply, client->Call(req));
    *count = reply.peers.size();
    for (size_t i = 0; i < reply.peers.size() && i < capacity; ++i) {
      const ipc::PeerState& p = reply.peers[i];
      polykv_peer_info o = polykv_peer_info_init();
#define POLYKV_PEER_TO_C(name) polykv::client::pool_info_c_internal::ToC(o.name, p.name);
      POLYKV_PEER_STATE_FIELDS(POLYKV_PEER_TO_C)
#undef POLYKV_PEER_TO_C
      WriteSized(o, stride, reinterpret_cast<char*>(peers) + i * stride);
    }
    return Status();
  });
}

polykv_status polykv_fetch_pool(polykv_client* client, const char* pool_id,
                                polykv_progress_fn progress, void* user, polykv_pool_info* out,
                                int* fetched) {
  if (client == nullptr) return Fail(POLYKV_INVALID_ARGUMENT, "polykv_fetch_pool: client is NULL");
  return Guarded("polykv_fetch_pool", [&]() -> Status {
    if (out != nullptr) POLYKV_RETURN_IF_ERROR(CheckPoolInfoSize("polykv_fetch_pool", "out", out));
    POLYKV_RETURN_IF_ERROR(CheckPoolId(pool_id));
    ipc::Request req;
    req.type = ipc::MessageType::kFetch;
    req.pool_id = pool_id;
    req.progress = true;  // heartbeats: silence means the daemon died or hung
    std::function<void(const ipc::Reply&)> on_progress;
    if (progress) {
      on_progress = [&](const ipc::Reply& p) { progress(p.stage.c_str(), p.done, p.total, user); };
    }
    StatusOr<ipc::Reply> reply;
    {
      std::lock_guard<std::mutex> lock(client->mu);
      reply = client->channel->CallStreaming(req, kDefaultCreateTimeoutMs, kCreateSilenceMs,
                                             on_progress);
    }
    if (!reply.ok()) return reply.status();
    POLYKV_RETURN_IF_ERROR(ipc::ReplyStatus(*reply));
    if (!reply->pool) return absl::InternalError("FETCH reply carries no pool description");
    if (out) ToCInfo(*reply->pool, out);
    if (fetched) *fetched = reply->created ? 1 : 0;
    return Status();
  });
}

polykv_status polykv_evict(polykv_client* client, const char* pool_id, int force) {
  if (client == nullptr) return Fail(POLYKV_INVALID_ARGUMENT, "polykv_evict: client is NULL");
  return Guarded("polykv_evict", [&]() -> Status {
    POLYKV_RETURN_IF_ERROR(CheckPoolId(pool_id));
    ipc::Request req;
    req.type = ipc::MessageType::kEvict;
    req.pool_id = pool_id;
    req.force = force != 0;
    return CallForPool(client, req).status();
  });
}

namespace {

/// Gives the lease back (best effort: an unreleased lease expires by itself).
Status SendDetach(polykv_pool* pool, int tries) {
  ipc::Request req;
  req.type = ipc::MessageType::kDetach;
  req.lease_id = pool->lease_id;
  req.pool_id = pool->info.id;
  req.client_pid = static_cast<uint32_t>(getpid());
  try {
    if (!pool->channel) pool->channel = std::make_unique<Channel>(pool->context, pool->endpoint);
    auto reply = pool->channel->CallOk(req, std::min(pool->timeout_ms, 1000), tries);
    // NOT_FOUND: the lease or pool is already gone, which is what detach wants.
    if (!reply.ok() && reply.status().code() != absl::StatusCode::kNotFound) {
      return reply.status();
    }
    return Status();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("DETACH: ", e.what()));
  }
}

Status MapPool(polykv_pool* pool, const ipc::MemoryHandle& mem) {
  const void* base = nullptr;
  uint64_t size = 0;
  polykv::kernels::Device device = polykv::kernels::Device::kCpu;
  bool verify_payload = false;
  if (mem.backend == ipc::PoolMemory::kHost && mem.transport == "memfd") {
    // The daemon hands the sealed memfd over its descriptor socket; MapSealed refuses a
    // descriptor that could still be written, so the pool cannot change under us.
    if (mem.fd_socket.empty()) return absl::InternalError("ATTACH reply has no descriptor socket");
    POLYKV_ASSIGN_OR_RETURN(ipc::UniqueFd fd,
                            ipc::RequestPoolFd(mem.fd_socket, pool->lease_id, pool->timeout_ms));
    POLYKV_ASSIGN_OR_RETURN(ipc::SealedRegion region,
                            ipc::SealedRegion::MapSealed(std::move(fd), mem.size));
    pool->sealed.emplace(std::move(region));
    base = pool->sealed->data();
    size = mem.size > 0 ? mem.size : pool->sealed->size();
  } else if (mem.backend == ipc::PoolMemory::kHost) {
    // A named POSIX shm object (older daemons): anyone with the daemon's uid could rewrite
    // it, so the whole payload checksum is verified once here.
    if (mem.shm_name.empty()) return absl::InternalError("ATTACH reply has no shm name");
    POLYKV_ASSIGN_OR_RETURN(ipc::ShmRegion region, ipc::ShmRegion::OpenReadOnly(mem.shm_name));
    pool->shm.emplace(std::move(region));
    base = pool->shm->data();
    size = pool->shm->size();
    if (mem.size > 0) {
      if (mem.size > size) {
        return absl::DataLossError(absl::StrCat("shm object ", mem.shm_name, " has ", size,
                                                " bytes, the daemon announced ", mem.size));
      }
      size = mem.size;
    }
    verify_payload = true;
  } else {  // kCuda (DecodeReply refuses any other backend)
    POLYKV_ASSIGN_OR_RETURN(ipc::CudaIpcMapping mapping, ipc::CudaIpcMapping::Open(mem.cuda));
    pool->cuda.emplace(std::move(mapping));
    base = pool->cuda->data();
    size = mem.size > 0 ? mem.size : pool->cuda->size();
    device = polykv::kernels::Device::kCuda;
  }
  POLYKV_ASSIGN_OR_RETURN(ipc::PoolReader reader,
                          ipc::PoolReader::Open(base, size, verify_payload, device));
  const std::string header_id = Hex(reader.header().pool_id, sizeof(reader.header().pool_id));
  if (header_id != pool->info.id) {
    return absl::DataLossError(
        absl::StrCat("mapped pool header has id ", header_id, ", expected ", pool->info.id));
  }
  if (device == polykv::kernels::Device::kCpu) {
    pool->map_base = static_cast<const uint8_t*>(base);
    pool->map_size = size;
  }
  pool->reader.emplace(std::move(reader));
  return Status();
}

}  // namespace

polykv_status polykv_attach(polykv_client* client, const char* pool_id, polykv_pool** out) {
  if (client == nullptr || out == nullptr) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_attach: client or out is NULL");
  }
  *out = nullptr;
  return Guarded("polykv_attach", [&]() -> Status {
    POLYKV_RETURN_IF_ERROR(CheckPoolId(pool_id));
    ipc::Request req;
    req.type = ipc::MessageType::kAttach;
    req.pool_id = pool_id;
    req.client_pid = static_cast<uint32_t>(getpid());
    // A pool the daemon must first replicate from a peer takes longer than one try: with
    // progress asked, the daemon sends heartbeats meanwhile and the wait lasts until its
    // answer (a clear status) instead of resending after the try's timeout.
    req.progress = true;
    const auto sent = Clock::now();
    StatusOr<ipc::Reply> reply = CallForPool(client, req);
    if (!reply.ok()) return reply.status();
    if (!reply->pool || !reply->memory) {
      return absl::InternalError("ATTACH reply lacks the pool description or memory handle");
    }
    auto pool = std::make_unique<polykv_pool>();
    pool->context = client->context;
    pool->endpoint = client->endpoint;
    pool->timeout_ms = client->timeout_ms;
    pool->info = *reply->pool;
    if (pool->info.id.empty()) pool->info.id = pool_id;
    pool->lease_id = reply->lease_id;
    pool->lease_ms = reply->lease_ms;
    if (pool->lease_ms <= 0 && reply->lease_expires_unix_ms > 0) {
      const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
      pool->lease_ms = std::max<int64_t>(0, reply->lease_expires_unix_ms - now_ms);
    }
    if (pool->lease_id.empty() || pool->lease_ms <= 0) {
      return absl::InternalError("ATTACH reply lacks a lease (lease_id / lease_ms)");
    }
    pool->lease_valid_until = sent + std::chrono::milliseconds(pool->lease_ms);
    pool->instance = reply->instance;
    pool->channel = std::make_unique<Channel>(pool->context, pool->endpoint);
    Status mapped = MapPool(pool.get(), *reply->memory);
    if (!mapped.ok()) {
      SendDetach(pool.get(), 1).IgnoreError();  // give the lease back; it would expire anyway
      return mapped;
    }
    polykv_pool* raw = pool.get();
    pool->renewer = std::thread([raw] { raw->RenewLoop(); });
    *out = pool.release();
    return Status();
  });
}

polykv_status polykv_detach(polykv_pool* pool) {
  if (pool == nullptr) return POLYKV_OK;
  polykv_status result = POLYKV_OK;
  try {
    bool lease_valid;
    {
      std::lock_guard<std::mutex> lock(pool->mu);
      pool->stop = true;
      lease_valid = pool->lease_code == POLYKV_OK;
    }
    pool->cancel = true;
    pool->cv.notify_all();
    if (pool->renewer.joinable()) pool->renewer.join();
    pool->cancel = false;
    if (lease_valid) result = ToC(SendDetach(pool, 2));
    pool->reader.reset();
    pool->sealed.reset();
    pool->shm.reset();
    pool->cuda.reset();
    pool->channel.reset();
  } catch (const std::exception& e) {
    result = Fail(POLYKV_INTERNAL, absl::StrCat("polykv_detach: ", e.what()));
  }
  delete pool;
  return result;
}

polykv_status polykv_pool_get_info(const polykv_pool* pool, polykv_pool_info* out) {
  if (pool == nullptr || out == nullptr) {
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_get_info: pool or out is NULL");
  }
  return Guarded("polykv_pool_get_info", [&]() -> Status {
    POLYKV_RETURN_IF_ERROR(CheckPoolInfoSize("polykv_pool_get_info", "out", out));
    ToCInfo(pool->info, out);
    return Status();
  });
}

polykv_status polykv_pool_mapping(const polykv_pool* pool, const void** base, uint64_t* size) {
  if (pool == nullptr || base == nullptr || size == nullptr)
    return Fail(POLYKV_INVALID_ARGUMENT, "polykv_pool_mapping: NULL argument");
  // map_base covers both host transports: a sealed memfd and an older daemon's POSIX shm.
  if (pool->map_base == nullptr)
    return Fail(POLYKV_FAILED_PRECONDITION,
                absl::StrCat("pool ", pool->info.id,
                             " lives in GPU memory: it has no host mapping (decode it instead)"));
  *base = pool->map_base;
  *size = pool->map_size;
  return POLYKV_OK;
}

}  // extern "C"

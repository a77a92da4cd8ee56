// polykvd's peer channel: CURVE-authenticated ZeroMQ between daemons, UCX for the bytes.
#include "peers.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "polykv/ipc/zmq_frames.h"
#include "serve_guarded.h"

namespace polykv::daemon {
namespace {

using Clock = std::chrono::steady_clock;

std::string RandomHex(size_t bytes) {
  std::random_device rd;
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned v = rd() & 0xff;
    out.push_back(kHex[v >> 4]);
    out.push_back(kHex[v & 15]);
  }
  return out;
}

int64_t UnixMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StatusOr<std::unique_ptr<Peers>> Peers::Start(PeerOptions options, Hooks hooks) {
  if (!options.listen.empty())
    POLYKV_RETURN_IF_ERROR(ipc::CheckTcpEndpoint(options.listen, "--listen"));
  for (const std::string& p : options.peers)
    POLYKV_RETURN_IF_ERROR(ipc::CheckTcpEndpoint(p, "--peer"));
  if (options.key_file.empty() || options.peer_keys_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.listen.empty() ? "--peer " + (options.peers.empty() ? "" : options.peers[0])
                               : "--listen " + options.listen,
        " needs CURVE keys: --key-file (this daemon's key pair, `polykv-cli keys generate`) and "
        "--peer-keys-file (the trusted daemons' public keys); a daemon without keys refuses "
        "to talk TCP to other daemons"));
  }
  std::unique_ptr<Peers> peers(new Peers(std::move(options), std::move(hooks)));
  POLYKV_ASSIGN_OR_RETURN(peers->keys_, ipc::ReadCurveKeyPairFile(peers->options_.key_file));
  POLYKV_ASSIGN_OR_RETURN(peers->peer_keys_, ipc::ReadPeerKeysFile(peers->options_.peer_keys_file));
  for (const std::string& p : peers->options_.peers) {
    if (!peers->peer_keys_.by_endpoint.count(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer ", p, ": the peer-keys file ", peers->options_.peer_keys_file,
                       " names no public key for it (add a line '<its public key> ", p, "')"));
    }
    ipc::PeerState st;
    st.endpoint = p;
    peers->states_[p] = st;
  }
  POLYKV_ASSIGN_OR_RETURN(peers->engine_, ipc::UcxEngine::Create());
  try {
    if (!peers->options_.listen.empty()) {
      // ZAP (RFC 27) handler first: CURVE handshakes on the router are checked against the
      // peer-keys file before any message is read.
      peers->zap_ = std::make_unique<zmq::socket_t>(peers->ctx_, zmq::socket_type::rep);
      peers->zap_->bind("inproc://zeromq.zap.01");
      peers->router_ = std::make_unique<zmq::socket_t>(peers->ctx_, zmq::socket_type::router);
      peers->router_->set(zmq::sockopt::linger, 0);
      peers->router_->set(zmq::sockopt::curve_server, 1);
      peers->router_->set(zmq::sockopt::curve_secretkey, peers->keys_.secret_key);
      peers->router_->set(zmq::sockopt::zap_domain, "polykv-peers");
      peers->router_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(ipc::kMaxMessageBytes));
      peers->router_->bind(peers->options_.listen);
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("--listen ", peers->options_.listen, ": bind failed: ", e.what()));
  }
  Peers* self = peers.get();
  if (peers->router_) peers->serve_thread_ = std::thread([self] { self->ServeLoop(); });
  if (!peers->options_.peers.empty())
    peers->ping_thread_ = std::thread([self] { self->PingLoop(); });
  spdlog::info("peer channel: listening on {}, {} peer(s) [{}], {} trusted key(s), UCX over {}",
               peers->options_.listen.empty() ? "(nothing)" : peers->options_.listen,
               peers->options_.peers.size(), absl::StrJoin(peers->options_.peers, ", "),
               peers->peer_keys_.trusted.size(), peers->engine_->transports());
  return peers;
}

Peers::~Peers() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_.store(true);
  }
  stop_cv_.notify_all();
  if (serve_thread_.joinable()) serve_thread_.join();
  if (ping_thread_.joinable()) ping_thread_.join();
  router_.reset();
  zap_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    transfers_.clear();  // unregisters every exposure before the engine goes
  }
  engine_.reset();
  ctx_.shutdown();
}

StatusOr<ipc::Reply> Peers::Call(const std::string& endpoint, ipc::Request request,
                                 int timeout_ms) {
  auto key = peer_keys_.by_endpoint.find(endpoint);
  if (key == peer_keys_.by_endpoint.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", endpoint, " has no public key in ", options_.peer_keys_file));
  }
  const std::string type(ipc::MessageTypeName(request.type));
  request.id = next_id_.fetch_add(1);
  try {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::curve_serverkey, key->second);
    s.set(zmq::sockopt::curve_publickey, keys_.public_key);
    s.set(zmq::sockopt::curve_secretkey, keys_.secret_key);
    s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(ipc::kMaxMessageBytes));
    // A socket monitor tells a refused CURVE handshake (ZAP 400) from silence.
    const std::string monitor = absl::StrCat("inproc://polykv-peer-monitor-", monitor_seq_++);
    if (zmq_socket_monitor(s.handle(), monitor.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) !=
        0) {
      return absl::InternalError(absl::StrCat("zmq_socket_monitor: ", zmq_strerror(zmq_errno())));
    }
    zmq::socket_t events(ctx_, zmq::socket_type::pair);
    events.set(zmq::sockopt::linger, 0);
    events.connect(monitor);
    struct StopMonitor {
      zmq::socket_t& s;
      ~StopMonitor() { zmq_socket_monitor(s.handle(), nullptr, 0); }
    } stop_monitor{s};
    s.connect(endpoint);
    if (auto sent = ipc::SendDealerRequest(s, ipc::EncodeRequest(request), /*dontwait=*/false);
        !sent.ok()) {
      return absl::UnavailableError(absl::StrCat("peer ", endpoint, ": ", sent.status().message()));
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || stop_.load()) break;
      zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0},
                                 {events.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2,
                std::min<std::chrono::milliseconds>(left, std::chrono::milliseconds(100)));
      if (items[1].revents & ZMQ_POLLIN) {
        std::vector<zmq::message_t> ev;
        (void)zmq::recv_multipart(events, std::back_inserter(ev));
        if (!ev.empty() && ev[0].size() >= 6) {
          uint16_t id;
          uint32_t value;
          std::memcpy(&id, ev[0].data(), 2);
          std::memcpy(&value, static_cast<const char*>(ev[0].data()) + 2, 4);
          if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            return absl::PermissionDeniedError(
                absl::StrCat("peer ", endpoint, " refused this daemon's CURVE key (ZAP status ",
                             value, "): its peer-keys file must list ", keys_.public_key));
          }
          return absl::PermissionDeniedError(
              absl::StrCat("CURVE handshake with peer ", endpoint, " failed (protocol error ",
                           value, "): does the peer-keys file hold its right public key?"));
        }
      }
      if (items[0].revents & ZMQ_POLLIN) {
        StatusOr<std::string> payload = ipc::RecvDealerReply(s, /*dontwait=*/false);
        if (!payload.ok()) {
          return absl::UnavailableError(
              absl::StrCat("peer ", endpoint, ": ", payload.status().message()));
        }
        auto reply = ipc::DecodeReply(*payload);
        if (!reply.ok()) {
          return Status(reply.status().code(), absl::StrCat("peer ", endpoint, " sent a bad ", type,
                                                            " reply: ", reply.status().message()));
        }
        if (reply->id != request.id) continue;
        return *std::move(reply);
      }
    }
    return absl::UnavailableError(
        absl::StrCat("peer ", endpoint, " did not answer ", type, " within ", timeout_ms,
                     " ms (down or unreachable, or its key differs from the peer-keys file's)"));
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("peer ", endpoint, ": ", e.what()));
  }
}

void Peers::NoteState(const std::string& endpoint, const Status& status, const ipc::Reply* reply,
                      double rtt_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(endpoint);
  if (it == states_.end()) return;
  ipc::PeerState& st = it->second;
  const std::string before = st.state;
  if (status.ok()) {
    st.state = "up";
    st.detail.clear();
    st.rtt_ms = rtt_ms;
    st.last_seen_unix_ms = UnixMsNow();
    if (reply != nullptr) {
      st.instance = reply->instance;
      st.version = reply->daemon_version;
      if (reply->type == ipc::MessageType::kList)
        st.pools = static_cast<uint32_t>(reply->pools.size());
    }
  } else {
    st.state = status.code() == absl::StatusCode::kPermissionDenied ? "refused" : "down";
    st.detail = std::string(status.message());
  }
  if (st.state != before) {
    if (st.state == "up") {
      spdlog::info("peer {} is up (instance {}, {} pools)", endpoint, st.instance.substr(0, 8),
                   st.pools);
    } else {
      spdlog::warn("peer {} is {}: {}", endpoint, st.state, st.detail);
    }
  }
}

void Peers::PingLoop() {
  while (!stop_.load()) {
    for (const std::string& endpoint : options_.peers) {
      if (stop_.load()) break;
      ipc::Request req;
      req.type = ipc::MessageType::kList;
      const auto t0 = Clock::now();
      auto reply = Call(endpoint, req, options_.call_timeout_ms);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      Status s = reply.ok() ? ipc::ReplyStatus(*reply) : reply.status();
      NoteState(endpoint, s, reply.ok() ? &*reply : nullptr, ms);
    }
    std::unique_lock<std::mutex> lock(stop_mu_);
    stop_cv_.wait_for(lock,
                      std::chrono::milliseconds(static_cast<int64_t>(options_.ping_seconds * 1000)),
                      [&] { return stop_.load(); });
  }
}

Status Peers::HandleZap(zmq::socket_t& zap) {
  // CURVE handshakes: only the public keys in the peer-keys file are let in.
  return ipc::ServeZapRequest(zap, [this](const ipc::ZapRequest& request) {
    std::string key;
    if (request.mechanism == "CURVE" && !request.credentials.empty() &&
        request.credentials[0].size() == 32) {
      char z85[41];
      zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(request.credentials[0].data()), 32);
      key = z85;
    }
    ipc::ZapReply reply;
    if (key.empty() || peer_keys_.trusted.count(key) == 0) {
      spdlog::warn("peer channel: refused {} from {}: {}", request.mechanism, request.address,
                   key.empty()
                       ? std::string("no CURVE key")
                       : absl::StrCat("public key ", key, " is not in ", options_.peer_keys_file));
      reply.status_code = "400";
      reply.status_text = "unknown CURVE key";
    }
    reply.user_id = key;
    return reply;
  });
}

ipc::Reply Peers::Answer(const ipc::Request& req) {
  ipc::Reply r;
  r.type = req.type;
  r.id = req.id;
  r.instance = hooks_.instance;
  r.daemon_version = hooks_.version;
  r.daemon_pid = static_cast<uint32_t>(getpid());
  if (!ipc::SpecOf(req.type).peer_channel) {
    return ipc::ErrorReply(
        req.type, req.id,
        absl::PermissionDeniedError(absl::StrCat(std::string(ipc::MessageTypeName(req.type)),
                                                 " is not served on the peer channel")));
  }
  switch (req.type) {
    case ipc::MessageType::kPing:
      return r;
    case ipc::MessageType::kList:
      r.pools = hooks_.list_pools();
      return r;
    case ipc::MessageType::kPeerFetch: {
      {
        // Refused before any memory is mapped or registered.
        std::lock_guard<std::mutex> lock(mu_);
        if (transfers_.size() >= 64) {
          return ipc::ErrorReply(
              req.type, req.id,
              absl::ResourceExhaustedError("64 transfers in flight: retry later"));
        }
      }
      auto pool = hooks_.export_pool(req.pool_id);
      if (!pool.ok()) return ipc::ErrorReply(req.type, req.id, pool.status());
      auto exposure = engine_->Expose(pool->data(), pool->size());
      if (!exposure.ok()) return ipc::ErrorReply(req.type, req.id, exposure.status());
      r.pool = pool->info;
      r.pool_bytes = pool->size();
      r.descriptor = (*exposure)->descriptor();
      r.transfer_id = RandomHex(16);
      const double hold_s = options_.transfer_hold_seconds + pool->size() / 50e6;
      Transfer t;
      t.pool = *std::move(pool);
      t.exposure = *std::move(exposure);
      t.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(hold_s * 1000));
      std::lock_guard<std::mutex> lock(mu_);
      spdlog::info("peer channel: serving pool {} ({} bytes) as transfer {}",
                   r.pool->id.substr(0, 16), r.pool_bytes, r.transfer_id.substr(0, 8));
      transfers_.emplace(r.transfer_id, std::move(t));
      return r;
    }
    case ipc::MessageType::kPeerRelease: {
      std::lock_guard<std::mutex> lock(mu_);
      if (transfers_.erase(req.transfer_id) == 0) {
        return ipc::ErrorReply(req.type, req.id,
                               absl::NotFoundError(absl::StrCat(
                                   "unknown transfer ", ipc::Abbreviate(req.transfer_id, 64))));
      }
      return r;
    }
    default:
      return ipc::ErrorReply(
          req.type, req.id,
          absl::PermissionDeniedError(absl::StrCat(std::string(ipc::MessageTypeName(req.type)),
                                                   " is not served on the peer channel")));
  }
}

Status Peers::HandleRequest(zmq::socket_t& router) {
  for (int i = 0; i < 64; ++i) {
    POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::RouterMessage> message,
                            ipc::RecvRouterMessage(router));
    if (!message) return absl::OkStatus();
    if (message->body_frames == 0) continue;  // identity only: nothing to answer
    const std::string_view frame = message->json();
    ipc::Reply reply;
    auto req = ipc::DecodeRequest(frame);
    if (!req.ok()) {
      reply = ipc::ErrorReplyForFrame(frame, req.status());
    } else {
      reply = ServeGuarded(*req, nullptr, [&] { return Answer(*req); });
    }
    reply.instance = hooks_.instance;
    Status sent = ipc::SendRouterReply(router, message->identity, message->delimiter,
                                       ipc::EncodeReply(reply));
    if (!sent.ok()) spdlog::warn("peer channel: send reply: {}", std::string(sent.message()));
  }
  return absl::OkStatus();
}

void Peers::SweepTransfers() {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    if (it->second.deadline < now) {
      spdlog::warn("peer channel: transfer {} of pool {} was never released; dropped",
                   it->first.substr(0, 8), it->second.pool.info.id.substr(0, 16));
      it = transfers_.erase(it);
    } else {
      ++it;
    }
  }
}

void Peers::ServeLoop() {
  auto last_sweep = Clock::now();
  while (!stop_.load()) {
    zmq::pollitem_t items[] = {{router_->handle(), 0, ZMQ_POLLIN, 0},
                               {zap_->handle(), 0, ZMQ_POLLIN, 0}};
    Status s;
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      s = ipc::ZmqErrorStatus(e);
    }
    if (s.ok() && (items[1].revents & ZMQ_POLLIN)) s = HandleZap(*zap_);
    if (s.ok() && (items[0].revents & ZMQ_POLLIN)) s = HandleRequest(*router_);
    if (absl::IsCancelled(s)) break;  // ETERM: the context is shutting down
    if (!s.ok() && !absl::IsAborted(s)) spdlog::warn("peer channel: {}", std::string(s.message()));
    if (Clock::now() - last_sweep > std::chrono::seconds(1)) {
      SweepTransfers();
      last_sweep = Clock::now();
    }
  }
}

StatusOr<PeerSource::Offer> Peers::Find(const std::string& pool_id) {
  std::vector<std::string> answers;
  bool any_not_found = false;
  for (const std::string& endpoint : options_.peers) {
    ipc::Request req;
    req.type = ipc::MessageType::kPeerFetch;
    req.pool_id = pool_id;
    const auto t0 = Clock::now();
    auto reply = Call(endpoint, req, options_.call_timeout_ms);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!reply.ok()) {
      NoteState(endpoint, reply.status(), nullptr, ms);
      answers.push_back(absl::StrCat(endpoint, ": ", reply.status().message()));
      continue;
    }
    NoteState(endpoint, absl::OkStatus(), nullptr, ms);
    if (Status s = ipc::ReplyStatus(*reply); !s.ok()) {
      any_not_found |= s.code() == absl::StatusCode::kNotFound;
      answers.push_back(absl::StrCat(endpoint, ": ", s.message()));
      continue;
    }
    if (!reply->pool || reply->descriptor.empty() || reply->transfer_id.empty() ||
        reply->pool_bytes == 0) {
      answers.push_back(absl::StrCat(endpoint,
                                     ": PEER_FETCH reply lacks pool, descriptor, "
                                     "transfer id or size"));
      continue;
    }
    Offer offer;
    offer.info = *reply->pool;
    offer.pool_bytes = reply->pool_bytes;
    offer.peer = endpoint;
    offer.transfer_id = reply->transfer_id;
    offer.descriptor = reply->descriptor;
    return offer;
  }
  const std::string what =
      absl::StrCat("pool ", ipc::Abbreviate(pool_id, 64), " is not held here nor by any peer (",
                   absl::StrJoin(answers, "; "), ")");
  return any_not_found ? absl::NotFoundError(what) : absl::UnavailableError(what);
}

Status Peers::Pull(const Offer& offer, void* dst, uint64_t size, const std::atomic<bool>* cancel,
                   const std::function<void(uint64_t, uint64_t)>& progress) {
  ipc::UcxPullOptions o;
  o.chunk_bytes = options_.chunk_bytes;
  o.max_outstanding = options_.max_outstanding;
  o.stall_timeout_ms = options_.stall_timeout_ms;
  o.cancel = cancel;
  o.progress = progress;
  o.test_chunk_delay_ms = options_.test_chunk_delay_ms;
  Status s = engine_->Pull(offer.descriptor, dst, size, o);
  if (!s.ok()) {
    return Status(s.code(), absl::StrCat("transfer of pool ", offer.info.id.substr(0, 16),
                                         " from peer ", offer.peer, " failed: ", s.message()));
  }
  return s;
}

void Peers::Release(const Offer& offer) {
  ipc::Request req;
  req.type = ipc::MessageType::kPeerRelease;
  req.transfer_id = offer.transfer_id;
  auto reply = Call(offer.peer, req, 1000);
  if (!reply.ok()) {
    spdlog::debug("release of transfer {} at {}: {}", offer.transfer_id.substr(0, 8), offer.peer,
                  reply.status().ToString());
  }
}

std::vector<ipc::PeerState> Peers::States() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ipc::PeerState> out;
  for (const std::string& p : options_.peers) out.push_back(states_.at(p));
  return out;
}

size_t Peers::active_transfers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return transfers_.size();
}

}  // namespace polykv::daemon

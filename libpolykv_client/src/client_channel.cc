// Lazy Pirate request/reply over a ZeroMQ DEALER socket (see client_channel.h).
#include "client_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "polykv/ipc/sealed_region.h"
#include "polykv/ipc/zmq_frames.h"

namespace polykv::client {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPollSliceMs = 50;  // cancel flag granularity
// How long PROGRESS messages can keep one try of Call waiting (the daemon's own bounds on
// replication, peer timeouts and stalled transfers, end it far sooner).
constexpr int kProgressCapMs = 600000;

}  // namespace

uint64_t NextRequestId() {
  // Start from a per-process random base so that ids of two processes (or of a process that
  // restarted) do not repeat each other in the daemon's logs.
  static std::atomic<uint64_t> next{[] {
    std::random_device rd;
    return ((uint64_t{rd()} << 20) ^ (uint64_t(getpid()) << 40) ^ rd()) & ((uint64_t{1} << 52) - 1);
  }()};
  uint64_t id = ++next;
  if (id == 0) id = ++next;
  return id;
}

Channel::Channel(std::shared_ptr<zmq::context_t> context, std::string endpoint)
    : context_(std::move(context)), endpoint_(std::move(endpoint)) {
  constexpr char kIpc[] = "ipc://";
  if (endpoint_.rfind(kIpc, 0) == 0) ipc_path_ = endpoint_.substr(sizeof(kIpc) - 1);
}

Status Channel::Probe() const {
  if (ipc_path_.empty() || ipc_path_[0] == '@') return Status();  // tcp:// or abstract
  Status s = ipc::ProbeUnixSocket(ipc_path_, SOCK_STREAM);
  if (s.code() == absl::StatusCode::kInvalidArgument) return Status();
  return s;
}

Channel::~Channel() {
  if (socket_) {
    try {
      socket_->set(zmq::sockopt::linger, 0);
      socket_->close();
    } catch (...) {
    }
  }
}

void Channel::Drop() {
  if (socket_) {
    socket_->set(zmq::sockopt::linger, 0);
    socket_->close();
    socket_.reset();
  }
}

Status Channel::Failed(const Status& s, const std::string& what) {
  Drop();
  return absl::UnavailableError(absl::StrCat("ZeroMQ error talking to polykvd at ", endpoint_, " (",
                                             what, "): ", s.message()));
}

void Channel::Reset() {
  Drop();
  auto socket = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::dealer);
  socket->set(zmq::sockopt::linger, 0);
  // Bound what a misbehaving peer can make us allocate (replies are small JSON).
  socket->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(4 * ipc::kMaxMessageBytes));
  socket->connect(endpoint_);
  socket_ = std::move(socket);
}

StatusOr<std::string> Channel::Encode(ipc::Request& request) {
  request.id = NextRequestId();
  POLYKV_RETURN_IF_ERROR(ipc::ValidateRequest(request));
  std::string frame = ipc::EncodeRequest(request);
  if (frame.size() > ipc::kMaxMessageBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(std::string(ipc::MessageTypeName(request.type)), " request is ", frame.size(),
                     " bytes, over the protocol limit of ", ipc::kMaxMessageBytes, " bytes"));
  }
  return frame;
}

StatusOr<std::optional<ipc::Reply>> Channel::Receive(const std::string& what) {
  StatusOr<std::string> payload = ipc::RecvDealerReply(*socket_, /*dontwait=*/true);
  if (!payload.ok()) return Failed(payload.status(), what);
  if (payload->empty()) return std::nullopt;
  StatusOr<ipc::Reply> reply = ipc::DecodeReply(*payload);
  if (!reply.ok()) {
    return Status(reply.status().code(), absl::StrCat("malformed reply from polykvd at ", endpoint_,
                                                      ": ", reply.status().message()));
  }
  if (!reply->instance.empty()) last_instance_ = reply->instance;
  return std::optional<ipc::Reply>(*std::move(reply));
}

StatusOr<ipc::Reply> Channel::Call(ipc::Request request, int try_timeout_ms, int tries,
                                   const std::function<void(const ipc::Reply&)>& on_progress,
                                   const std::atomic<bool>* cancel) {
  if (try_timeout_ms <= 0) try_timeout_ms = 1;
  if (tries <= 0) tries = 1;
  POLYKV_ASSIGN_OR_RETURN(const std::string frame, Encode(request));
  const std::string what = std::string(ipc::MessageTypeName(request.type));
  for (int attempt = 0; attempt < tries; ++attempt) {
    // Fail at once, with the reason, when the socket is missing, dead or forbidden.
    POLYKV_RETURN_IF_ERROR(Probe());
    // A fresh socket for every try after the first (Lazy Pirate): a lost reply can then
    // never be confused with this try's, and nothing queued lingers on the old socket.
    if (!socket_ || attempt > 0) Reset();
    // DEALER mimics REQ's envelope: an empty delimiter frame, then the JSON.
    StatusOr<bool> sent = ipc::SendDealerRequest(*socket_, frame, /*dontwait=*/true);
    if (!sent.ok()) return Failed(sent.status(), what);
    if (!*sent) {
      // Cannot queue (no pipe yet): wait out this try, then rebuild the socket.
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(try_timeout_ms, 100)));
      continue;
    }
    auto deadline = Clock::now() + std::chrono::milliseconds(try_timeout_ms);
    const auto cap = Clock::now() + std::chrono::milliseconds(kProgressCapMs);
    while (true) {
      if (cancel && cancel->load()) return absl::CancelledError("request cancelled");
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) break;
      zmq::pollitem_t item{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(std::min<int64_t>(left.count(), kPollSliceMs)));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      POLYKV_ASSIGN_OR_RETURN(std::optional<ipc::Reply> reply, Receive(what));
      if (!reply) continue;
      if (reply->id != request.id) continue;  // stale: a reply to an earlier request
      if (reply->type == ipc::MessageType::kProgress) {
        // The daemon is working on this request (an ATTACH that replicates the pool from a
        // peer, say): this try waits try_timeout_ms more, since a resend would only queue the
        // same work again. The PROGRESS messages themselves (a heartbeat every
        // ipc::kHeartbeatMs) bound how long silence can last; kProgressCapMs bounds the whole.
        deadline = std::min(cap, Clock::now() + std::chrono::milliseconds(try_timeout_ms));
        if (on_progress) on_progress(*reply);
        continue;
      }
      return *std::move(reply);
    }
  }
  // Leave no half-finished exchange on the socket: the next Call starts clean.
  Drop();
  return absl::UnavailableError(absl::StrCat(
      "no reply from polykvd at ", endpoint_, " to ", what, " after ", tries,
      (tries == 1 ? " try" : " tries"), " of ", try_timeout_ms, " ms (is the daemon running?)"));
}

StatusOr<ipc::Reply> Channel::CallOk(ipc::Request request, int try_timeout_ms, int tries,
                                     const std::function<void(const ipc::Reply&)>& on_progress,
                                     const std::atomic<bool>* cancel) {
  POLYKV_ASSIGN_OR_RETURN(ipc::Reply reply,
                          Call(std::move(request), try_timeout_ms, tries, on_progress, cancel));
  POLYKV_RETURN_IF_ERROR(ipc::ReplyStatus(reply));
  return reply;
}

StatusOr<ipc::Reply> Channel::CallStreaming(
    ipc::Request request, int timeout_ms, int silence_ms,
    const std::function<void(const ipc::Reply&)>& on_progress) {
  if (timeout_ms <= 0) timeout_ms = 1;
  if (silence_ms <= 0) silence_ms = 1;
  POLYKV_ASSIGN_OR_RETURN(const std::string frame, Encode(request));
  const std::string what = std::string(ipc::MessageTypeName(request.type));
  POLYKV_RETURN_IF_ERROR(Probe());
  if (!socket_) Reset();
  StatusOr<bool> sent = ipc::SendDealerRequest(*socket_, frame, /*dontwait=*/true);
  if (!sent.ok()) return Failed(sent.status(), what);
  if (!*sent) {
    Drop();
    return absl::UnavailableError(absl::StrCat("cannot send ", what, " to polykvd at ", endpoint_,
                                               " (is the daemon running?)"));
  }
  // A daemon that stamps replies with its instance also sends heartbeats: only then is
  // silence a failure. Older daemons get the plain overall timeout.
  const std::string known_instance = last_instance_;
  const bool heartbeats = !known_instance.empty();
  std::string instance;  // of the daemon handling this request, from its first message
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  auto last_heard = start;
  auto last_probe = start;
  auto last_ping = start - std::chrono::hours(1);
  uint64_t ping_id = 0;
  auto restarted = [&](const std::string& was, const std::string& now) {
    Drop();
    return absl::AbortedError(absl::StrCat(
        "polykvd at ", endpoint_, " restarted while the ", what, " was in progress (instance ",
        was.substr(0, 8), " -> ", now.substr(0, 8), "): the request was lost; send it again"));
  };
  while (true) {
    const auto now = Clock::now();
    if (now >= deadline) {
      Drop();
      return absl::DeadlineExceededError(absl::StrCat(what, " got no reply from polykvd at ",
                                                      endpoint_, " within ", timeout_ms, " ms"));
    }
    if (now - last_probe >= std::chrono::seconds(1)) {
      last_probe = now;
      if (Status alive = Probe(); !alive.ok()) {
        Drop();
        return absl::UnavailableError(absl::StrCat("polykvd went away during ", what, ": ",
                                                   alive.message(), "; the request was lost"));
      }
    }
    if (heartbeats) {
      const auto quiet = now - last_heard;
      if (quiet >= std::chrono::milliseconds(silence_ms)) {
        Drop();
        return absl::UnavailableError(
            absl::StrCat("no word from polykvd at ", endpoint_, " for ",
                         std::chrono::duration_cast<std::chrono::milliseconds>(quiet).count(),
                         " ms during ", what, " (it sends a heartbeat every ", ipc::kHeartbeatMs,
                         " ms): the daemon died or hung; the request was lost"));
      }
      if (quiet >= std::chrono::milliseconds(silence_ms / 2) &&
          now - last_ping >= std::chrono::milliseconds(silence_ms / 4 + 1)) {
        last_ping = now;
        ipc::Request ping;
        ping.type = ipc::MessageType::kPing;
        ping.id = ping_id = NextRequestId();
        // Not queued (false) is like a lost PING: the silence check above decides.
        StatusOr<bool> pinged =
            ipc::SendDealerRequest(*socket_, ipc::EncodeRequest(ping), /*dontwait=*/true);
        if (!pinged.ok()) return Failed(pinged.status(), what);
      }
    }
    zmq::pollitem_t item{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(kPollSliceMs));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    StatusOr<std::optional<ipc::Reply>> received = Receive(what);
    if (!received.ok()) {
      Drop();  // a malformed reply too
      return received.status();
    }
    std::optional<ipc::Reply>& reply = *received;
    if (!reply) continue;
    if (ping_id != 0 && reply->id == ping_id) {
      const std::string& expected = instance.empty() ? known_instance : instance;
      if (!reply->instance.empty() && !expected.empty() && reply->instance != expected) {
        return restarted(expected, reply->instance);
      }
      continue;  // alive, same daemon: keep waiting for word of our request
    }
    if (reply->id != request.id) continue;  // stale
    last_heard = Clock::now();
    if (!reply->instance.empty()) {
      if (instance.empty()) instance = reply->instance;
      if (reply->instance != instance) return restarted(instance, reply->instance);
    }
    if (reply->type == ipc::MessageType::kProgress) {
      if (on_progress && !reply->heartbeat) on_progress(*reply);
      continue;
    }
    return *std::move(reply);
  }
}

}  // namespace polykv::client

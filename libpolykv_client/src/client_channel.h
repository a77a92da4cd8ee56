// Lazy Pirate request/reply channel to polykvd over a ZeroMQ DEALER socket (internal).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "polykv/ipc/protocol.h"
#include "polykv/status.h"

namespace polykv::client {

/// One DEALER socket to the daemon. Not thread-safe (one owner thread at a time, as every
/// zmq socket). Implements the ZeroMQ guide's "Lazy Pirate": each try waits `try_timeout_ms`
/// for the reply whose id matches the request (stale replies of earlier tries or requests
/// are dropped), then the socket is closed with LINGER=0 and rebuilt before the next try.
/// For ipc:// endpoints the socket file is probed with connect(2) before the first try and
/// between tries, so a missing socket, a dead daemon's stale socket (ECONNREFUSED) and a
/// socket this uid may not open (EACCES) fail at once with a precise error instead of
/// after every try's timeout.
class Channel {
 public:
  /// Does not connect yet (the socket is built lazily by Call).
  Channel(std::shared_ptr<zmq::context_t> context, std::string endpoint);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Sends `request` (its id is set here) up to `tries` times, each waiting `try_timeout_ms`
  /// milliseconds. PROGRESS messages for the request go to `on_progress` (may be empty), and
  /// each one gives the try `try_timeout_ms` more (the daemon is working on it: a request it
  /// runs on a worker, e.g. an ATTACH that replicates the pool, sends a heartbeat every
  /// ipc::kHeartbeatMs when `request.progress` is set), up to 10 minutes in all.
  /// `cancel`, when given and set, ends the wait early with kCancelled.
  /// Returns the reply (ok or error reply: check ipc::ReplyStatus). Errors: kUnavailable
  /// when no try got a reply; kInvalidArgument / kFailedPrecondition for a malformed or
  /// version-mismatched reply.
  [[nodiscard]] StatusOr<ipc::Reply> Call(
      ipc::Request request, int try_timeout_ms, int tries,
      const std::function<void(const ipc::Reply&)>& on_progress = {},
      const std::atomic<bool>* cancel = nullptr);

  /// Like Call but returns the reply's own status as the error for error replies.
  [[nodiscard]] StatusOr<ipc::Reply> CallOk(
      ipc::Request request, int try_timeout_ms, int tries,
      const std::function<void(const ipc::Reply&)>& on_progress = {},
      const std::atomic<bool>* cancel = nullptr);

  /// One long request with PROGRESS (CREATE_POOL), sent once and never resent. Fails fast
  /// when the daemon goes away: kUnavailable when its socket stops accepting (probed every
  /// second) or, for daemons that send heartbeats (an instance id in their replies), when
  /// nothing arrives for `silence_ms`; kAborted when replies start coming from another
  /// daemon instance (a restart on the same endpoint: the request is lost). After
  /// `silence_ms / 2` of silence it PINGs to tell a restart from a hang.
  /// kDeadlineExceeded after `timeout_ms` in all. Returns the final reply (ok or error).
  [[nodiscard]] StatusOr<ipc::Reply> CallStreaming(
      ipc::Request request, int timeout_ms, int silence_ms,
      const std::function<void(const ipc::Reply&)>& on_progress);

  const std::string& endpoint() const { return endpoint_; }
  /// Instance id of the daemon that sent the last reply seen on this channel ("" if none,
  /// or a daemon too old to send one).
  const std::string& last_instance() const { return last_instance_; }
  /// kOk when the endpoint's socket accepts connections (always OK for non-ipc endpoints).
  [[nodiscard]] Status Probe() const;

 private:
  void Reset();  ///< closes the socket (LINGER=0) and connects a fresh one
  void Drop();   ///< closes the socket (LINGER=0), if there is one
  /// A ZeroMQ failure `s` while sending or receiving `what`, as kUnavailable naming the daemon
  /// (after Drop: the next call starts on a fresh socket).
  [[nodiscard]] Status Failed(const Status& s, const std::string& what);
  /// Gives `request` the next request id, validates and encodes it: the frame. Errors: the
  /// validation's, kResourceExhausted over ipc::kMaxMessageBytes.
  [[nodiscard]] static StatusOr<std::string> Encode(ipc::Request& request);
  /// Reads one whole message from the socket (the JSON is its last frame) and decodes it,
  /// remembering the instance it names; nullopt for an empty message. Errors: Failed's, or
  /// the decoder's naming the daemon (the socket kept).
  [[nodiscard]] StatusOr<std::optional<ipc::Reply>> Receive(const std::string& what);
  std::shared_ptr<zmq::context_t> context_;
  std::string endpoint_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::string ipc_path_;  ///< socket file of an ipc:// endpoint, "" otherwise
  std::string last_instance_;
};

/// A process-wide unique, never-zero request id.
uint64_t NextRequestId();

}  // namespace polykv::client

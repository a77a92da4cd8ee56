// ZeroMQ framing of the control protocol, shared by the client and the daemon: the DEALER
// request envelope (an empty delimiter frame, then one JSON frame), the ROUTER side (identity,
// an optional empty delimiter, one JSON body; a reply goes back the same way), ZAP (RFC 27)
// requests and replies, and the "uid:gid:pid" User-Id the daemon's ZAP handler gives ipc://
// peers. Every zmq::error_t is caught here and returned as a Status (ZmqErrorStatus).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "polykv/status.h"

namespace polykv::ipc {

/// A zmq::error_t as a Status whose message is e.what(): kCancelled for ETERM (the context
/// was shut down: stop serving), kAborted for EINTR (a signal: try again), kUnavailable for
/// anything else.
[[nodiscard]] Status ZmqErrorStatus(const zmq::error_t& e);

// ---- DEALER: the requesting side ------------------------------------------------------------

/// Sends `json` framed as REQ would frame it: an empty delimiter frame, then `json`. With
/// `dontwait`, returns false (and sends nothing) when the message cannot be queued now (no
/// connected pipe yet, or the send high-water mark); without it, blocks until it is queued.
/// Errors: ZmqErrorStatus.
[[nodiscard]] StatusOr<bool> SendDealerRequest(zmq::socket_t& socket, std::string_view json,
                                               bool dontwait);

/// Reads one whole multipart message and returns its last frame (the JSON; the delimiter
/// before it is dropped). With `dontwait`, returns "" when no message is waiting; without it,
/// blocks until one arrives. Errors: ZmqErrorStatus.
[[nodiscard]] StatusOr<std::string> RecvDealerReply(zmq::socket_t& socket, bool dontwait);

// ---- ROUTER: the serving side ---------------------------------------------------------------

/// One message as a ROUTER socket receives it: [identity][empty delimiter]?[body...].
struct RouterMessage {
  std::string identity;    ///< the sender's routing id (the first frame)
  bool delimiter = false;  ///< an empty frame followed the identity (REQ, or DEALER as REQ)
  size_t body_frames = 0;  ///< frames after the identity and delimiter; a request has 1
  zmq::message_t body;     ///< the last frame: the JSON, with the connection's metadata

  /// The last frame's bytes (valid while this message lives).
  std::string_view json() const {
    return std::string_view(static_cast<const char*>(body.data()), body.size());
  }
  /// kInvalidArgument "expected one JSON frame after the delimiter, got N" unless the
  /// message has exactly one body frame.
  [[nodiscard]] Status CheckOneBody() const;
};

/// Receives one message without waiting: nullopt when none is waiting. A message of the
/// identity alone comes back with body_frames 0 (nothing to answer). Errors: ZmqErrorStatus.
[[nodiscard]] StatusOr<std::optional<RouterMessage>> RecvRouterMessage(zmq::socket_t& router);

/// Sends `json` back to `identity`, framed as the request was: [identity][empty, when
/// `delimiter`][json]. Errors: ZmqErrorStatus.
[[nodiscard]] Status SendRouterReply(zmq::socket_t& router, std::string_view identity,
                                     bool delimiter, std::string_view json);

// ---- Peer credentials (ipc:// endpoints) ----------------------------------------------------

/// A local peer's credentials, from SO_PEERCRED.
struct PeerCredentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t pid = 0;
};

/// The ZAP User-Id of an ipc:// peer: libzmq appends ":uid:gid:pid" (SO_PEERCRED) to the
/// address it passes to ZAP; this returns "uid:gid:pid" from it (the last three of at least
/// four ':'-separated fields), or "" when the address has fewer.
std::string CredentialsUserId(std::string_view zap_address);

/// Parses a User-Id "uid:gid:pid" (decimal, 32-bit each); nullopt when malformed.
std::optional<PeerCredentials> ParseCredentialsUserId(std::string_view user_id);

/// The credentials a ZAP handler that used CredentialsUserId attached to a received frame
/// (its "User-Id" property); nullopt when the frame has none or they are malformed.
std::optional<PeerCredentials> CredentialsOf(const zmq::message_t& frame);

// ---- ZAP (RFC 27) ---------------------------------------------------------------------------

/// The ZAP request libzmq sends to inproc://zeromq.zap.01 during a handshake. Frames a
/// request lacks are empty.
struct ZapRequest {
  std::string version;     ///< "1.0"
  std::string request_id;  ///< echoed in the reply
  std::string domain;      ///< the server socket's zap_domain
  std::string address;     ///< the peer's address (ipc://: with ":uid:gid:pid" appended)
  std::string identity;    ///< the server socket's routing id
  std::string mechanism;   ///< "NULL", "PLAIN" or "CURVE"
  /// The mechanism's credentials (CURVE: the client's 32-byte public key).
  std::vector<std::string> credentials;
};

/// A ZAP handler's answer.
struct ZapReply {
  std::string status_code = "200";  ///< "200" lets the peer in; "400" refuses it
  std::string status_text = "OK";
  std::string user_id;  ///< becomes the "User-Id" property of the peer's messages
};

/// Answers one ZAP request waiting on `zap` (a REP socket bound to inproc://zeromq.zap.01)
/// with `decide`'s reply; does nothing when no request is waiting. Errors: ZmqErrorStatus.
[[nodiscard]] Status ServeZapRequest(zmq::socket_t& zap,
                                     const std::function<ZapReply(const ZapRequest&)>& decide);

}  // namespace polykv::ipc

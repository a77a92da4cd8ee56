// ZeroMQ framing of the control protocol (see zmq_frames.h).
#include "polykv/ipc/zmq_frames.h"

#include <array>
#include <cerrno>
#include <iterator>
#include <utility>
#include <zmq_addon.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace polykv::ipc {

Status ZmqErrorStatus(const zmq::error_t& e) {
  switch (e.num()) {
    case ETERM:
      return absl::CancelledError(e.what());
    case EINTR:
      return absl::AbortedError(e.what());
    default:
      return absl::UnavailableError(e.what());
  }
}

StatusOr<bool> SendDealerRequest(zmq::socket_t& socket, std::string_view json, bool dontwait) {
  const zmq::send_flags flags = dontwait ? zmq::send_flags::dontwait : zmq::send_flags::none;
  try {
    zmq::message_t delimiter;
    if (!socket.send(delimiter, zmq::send_flags::sndmore | flags)) return false;
    // Queued as one message with the delimiter: the second part cannot find the pipe full.
    if (!socket.send(zmq::const_buffer(json.data(), json.size()), flags)) return false;
    return true;
  } catch (const zmq::error_t& e) {
    return ZmqErrorStatus(e);
  }
}

StatusOr<std::string> RecvDealerReply(zmq::socket_t& socket, bool dontwait) {
  const zmq::recv_flags flags = dontwait ? zmq::recv_flags::dontwait : zmq::recv_flags::none;
  try {
    // Keep only the last frame: the JSON (the parts of one message arrive together).
    std::string payload;
    bool more = true;
    while (more) {
      zmq::message_t part;
      if (!socket.recv(part, flags)) break;
      more = part.more();
      payload.assign(static_cast<const char*>(part.data()), part.size());
    }
    return payload;
  } catch (const zmq::error_t& e) {
    return ZmqErrorStatus(e);
  }
}

Status RouterMessage::CheckOneBody() const {
  if (body_frames == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("expected one JSON frame after the delimiter, got ", body_frames));
}

StatusOr<std::optional<RouterMessage>> RecvRouterMessage(zmq::socket_t& router) {
  std::vector<zmq::message_t> parts;
  try {
    if (!zmq::recv_multipart(router, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
      return std::optional<RouterMessage>();
    }
  } catch (const zmq::error_t& e) {
    return ZmqErrorStatus(e);
  }
  RouterMessage m;
  if (!parts.empty()) m.identity = parts[0].to_string();
  if (parts.size() < 2) return std::optional<RouterMessage>(std::move(m));
  m.delimiter = parts.size() >= 3 && parts[1].size() == 0;
  m.body_frames = parts.size() - 1 - (m.delimiter ? 1 : 0);
  m.body = std::move(parts.back());
  return std::optional<RouterMessage>(std::move(m));
}

Status SendRouterReply(zmq::socket_t& router, std::string_view identity, bool delimiter,
                       std::string_view json) {
  try {
    router.send(zmq::const_buffer(identity.data(), identity.size()), zmq::send_flags::sndmore);
    if (delimiter) router.send(zmq::message_t(), zmq::send_flags::sndmore);
    router.send(zmq::const_buffer(json.data(), json.size()), zmq::send_flags::none);
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return ZmqErrorStatus(e);
  }
}

std::string CredentialsUserId(std::string_view zap_address) {
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(zap_address.data(), zap_address.size()), ':');
  if (f.size() < 4) return "";
  const size_t n = f.size();
  return absl::StrCat(f[n - 3], ":", f[n - 2], ":", f[n - 1]);
}

std::optional<PeerCredentials> ParseCredentialsUserId(std::string_view user_id) {
  const std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(user_id.data(), user_id.size()), ':');
  PeerCredentials c;
  if (f.size() != 3 || !absl::SimpleAtoi(f[0], &c.uid) || !absl::SimpleAtoi(f[1], &c.gid) ||
      !absl::SimpleAtoi(f[2], &c.pid)) {
    return std::nullopt;
  }
  return c;
}

std::optional<PeerCredentials> CredentialsOf(const zmq::message_t& frame) {
  // zmq_msg_gets takes a non-const message but only reads the metadata it points to.
  const char* user_id = zmq_msg_gets(const_cast<zmq_msg_t*>(frame.handle()), "User-Id");
  if (user_id == nullptr) return std::nullopt;  // no ZAP handler, or no User-Id
  return ParseCredentialsUserId(user_id);
}

Status ServeZapRequest(zmq::socket_t& zap,
                       const std::function<ZapReply(const ZapRequest&)>& decide) {
  try {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(zap, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
      return absl::OkStatus();  // nothing waiting
    }
    auto frame = [&](size_t i) { return i < frames.size() ? frames[i].to_string() : ""; };
    ZapRequest request;
    request.version = frame(0);
    request.request_id = frame(1);
    request.domain = frame(2);
    request.address = frame(3);
    request.identity = frame(4);
    request.mechanism = frame(5);
    for (size_t i = 6; i < frames.size(); ++i) request.credentials.push_back(frame(i));
    const ZapReply reply = decide(request);
    std::array<zmq::const_buffer, 6> out = {
        zmq::str_buffer("1.0"),         zmq::buffer(request.request_id),
        zmq::buffer(reply.status_code), zmq::buffer(reply.status_text),
        zmq::buffer(reply.user_id),     zmq::const_buffer(nullptr, 0)};  // metadata: none
    (void)zmq::send_multipart(zap, out);
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return ZmqErrorStatus(e);
  }
}

}  // namespace polykv::ipc

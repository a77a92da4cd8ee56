// ZeroMQ framing helpers (polykv/ipc/zmq_frames.h): DEALER <-> ROUTER round trips with and
// without the delimiter, the one-body check, ZAP requests and the uid:gid:pid User-Id over a
// real ipc:// socket, and errors as Status.
#include "polykv/ipc/zmq_frames.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq_addon.hpp>

namespace polykv::ipc {
namespace {

// Waits up to `ms` for a message on `s`.
bool Readable(zmq::socket_t& s, int ms) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, std::chrono::milliseconds(ms));
  return (item.revents & ZMQ_POLLIN) != 0;
}

// A ROUTER bound to an inproc endpoint and a DEALER connected to it.
struct Pair {
  zmq::context_t ctx;
  zmq::socket_t router{ctx, zmq::socket_type::router};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
  Pair() {
    router.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::linger, 0);
    router.bind("inproc://zmq-frames-test");
    dealer.connect("inproc://zmq-frames-test");
  }
  RouterMessage Receive() {
    EXPECT_TRUE(Readable(router, 2000));
    StatusOr<std::optional<RouterMessage>> m = RecvRouterMessage(router);
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(m.ok() && m->has_value());
    return m.ok() && m->has_value() ? std::move(**m) : RouterMessage();
  }
};

TEST(ZmqFramesTest, DealerRequestAndRouterReplyRoundTrip) {
  Pair p;
  StatusOr<bool> sent = SendDealerRequest(p.dealer, R"({"type":"PING"})", /*dontwait=*/false);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_TRUE(*sent);
  RouterMessage m = p.Receive();
  EXPECT_FALSE(m.identity.empty());
  EXPECT_TRUE(m.delimiter);
  EXPECT_EQ(m.body_frames, 1u);
  EXPECT_EQ(m.json(), R"({"type":"PING"})");
  EXPECT_TRUE(m.CheckOneBody().ok());

  ASSERT_TRUE(SendRouterReply(p.router, m.identity, m.delimiter, R"({"ok":true})").ok());
  ASSERT_TRUE(Readable(p.dealer, 2000));
  // The DEALER receives [empty][json]; the helper returns the JSON alone.
  StatusOr<std::string> reply = RecvDealerReply(p.dealer, /*dontwait=*/true);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(*reply, R"({"ok":true})");
}

TEST(ZmqFramesTest, DealerWithoutDelimiterIsAnsweredWithout) {
  Pair p;
  p.dealer.send(zmq::str_buffer("{}"), zmq::send_flags::none);
  RouterMessage m = p.Receive();
  EXPECT_FALSE(m.delimiter);
  EXPECT_EQ(m.body_frames, 1u);
  EXPECT_EQ(m.json(), "{}");
  ASSERT_TRUE(SendRouterReply(p.router, m.identity, m.delimiter, "answer").ok());
  ASSERT_TRUE(Readable(p.dealer, 2000));
  std::vector<zmq::message_t> parts;
  ASSERT_TRUE(zmq::recv_multipart(p.dealer, std::back_inserter(parts)));
  ASSERT_EQ(parts.size(), 1u);  // no delimiter added
  EXPECT_EQ(parts[0].to_string(), "answer");
}

TEST(ZmqFramesTest, TwoBodyFramesFailTheOneBodyCheck) {
  Pair p;
  std::array<zmq::const_buffer, 3> frames = {zmq::const_buffer(nullptr, 0), zmq::str_buffer("a"),
                                             zmq::str_buffer("b")};
  ASSERT_TRUE(zmq::send_multipart(p.dealer, frames));
  RouterMessage m = p.Receive();
  EXPECT_TRUE(m.delimiter);
  EXPECT_EQ(m.body_frames, 2u);
  EXPECT_EQ(m.json(), "b");
  Status s = m.CheckOneBody();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "expected one JSON frame after the delimiter, got 2");
}

TEST(ZmqFramesTest, NothingWaiting) {
  Pair p;
  StatusOr<std::optional<RouterMessage>> m = RecvRouterMessage(p.router);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->has_value());
  StatusOr<std::string> reply = RecvDealerReply(p.dealer, /*dontwait=*/true);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(*reply, "");
  // A DEALER with no peer cannot queue: false, not an error, and nothing blocks.
  zmq::socket_t lone(p.ctx, zmq::socket_type::dealer);
  lone.set(zmq::sockopt::linger, 0);
  StatusOr<bool> sent = SendDealerRequest(lone, "{}", /*dontwait=*/true);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_FALSE(*sent);
}

TEST(ZmqFramesTest, ZmqErrorsBecomeStatuses) {
  errno = ETERM;  // zmq::error_t takes zmq_errno(), which is errno
  const zmq::error_t term;
  errno = EINTR;
  const zmq::error_t interrupted;
  errno = EHOSTUNREACH;
  const zmq::error_t unreachable;
  EXPECT_EQ(ZmqErrorStatus(term).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ZmqErrorStatus(interrupted).code(), absl::StatusCode::kAborted);
  Status s = ZmqErrorStatus(unreachable);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), zmq_strerror(EHOSTUNREACH));

  // A closed context: the helpers return ETERM as kCancelled instead of throwing.
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  router.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::linger, 0);
  ctx.shutdown();
  EXPECT_EQ(RecvRouterMessage(router).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(SendRouterReply(router, "x", true, "{}").code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(SendDealerRequest(dealer, "{}", true).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(RecvDealerReply(dealer, true).status().code(), absl::StatusCode::kCancelled);
}

TEST(ZmqFramesTest, CredentialsUserIdAndItsParser) {
  EXPECT_EQ(CredentialsUserId("/run/polykv/control.sock:1000:100:4242"), "1000:100:4242");
  EXPECT_EQ(CredentialsUserId(":0:0:1"), "0:0:1");
  EXPECT_EQ(CredentialsUserId("127.0.0.1"), "");
  EXPECT_EQ(CredentialsUserId("1:2:3"), "");  // three fields: no address before them

  std::optional<PeerCredentials> c = ParseCredentialsUserId("1000:100:4242");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->uid, 1000u);
  EXPECT_EQ(c->gid, 100u);
  EXPECT_EQ(c->pid, 4242u);
  c = ParseCredentialsUserId("4294967295:0:1");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->uid, 4294967295u);
  EXPECT_FALSE(ParseCredentialsUserId("").has_value());
  EXPECT_FALSE(ParseCredentialsUserId("1:2").has_value());
  EXPECT_FALSE(ParseCredentialsUserId("1:2:3:4").has_value());
  EXPECT_FALSE(ParseCredentialsUserId("a:2:3").has_value());
  EXPECT_FALSE(ParseCredentialsUserId("1:2:4294967296").has_value());

  zmq::message_t plain("x", 1);  // never received: no metadata
  EXPECT_FALSE(CredentialsOf(plain).has_value());
}

// A ZAP handler on its own thread, as the daemon runs one, answering with `decide`.
class ZapThread {
 public:
  ZapThread(zmq::context_t& ctx, std::function<ZapReply(const ZapRequest&)> decide)
      : zap_(ctx, zmq::socket_type::rep), decide_(std::move(decide)) {
    zap_.set(zmq::sockopt::linger, 0);
    zap_.bind("inproc://zeromq.zap.01");
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        if (!Readable(zap_, 20)) continue;
        Status s = ServeZapRequest(zap_, decide_);
        if (!s.ok()) errors_.fetch_add(1);
      }
    });
  }
  ~ZapThread() {
    stop_.store(true);
    thread_.join();
  }
  int errors() const { return errors_.load(); }

 private:
  zmq::socket_t zap_;
  std::function<ZapReply(const ZapRequest&)> decide_;
  std::atomic<bool> stop_{false};
  std::atomic<int> errors_{0};
  std::thread thread_;
};

std::string SocketPath() { return "/tmp/polykv-zmq-frames-" + std::to_string(getpid()) + ".sock"; }

// A ROUTER on `ipc://path` in the ZAP domain "zmq-frames-test" (so the context's ZAP handler
// is asked about every peer) and a DEALER connected to it, both with linger 0.
struct ZapPair {
  zmq::socket_t router;
  zmq::socket_t dealer;
  ZapPair(zmq::context_t& ctx, const std::string& path)
      : router(ctx, zmq::socket_type::router), dealer(ctx, zmq::socket_type::dealer) {
    router.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::zap_domain, "zmq-frames-test");
    router.bind("ipc://" + path);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect("ipc://" + path);
  }
};

TEST(ZmqFramesTest, ZapUserIdCarriesThePeersCredentials) {
  const std::string path = SocketPath();
  zmq::context_t ctx;
  std::mutex mu;
  ZapRequest seen;
  ZapThread zap(ctx, [&](const ZapRequest& r) {
    std::lock_guard<std::mutex> lock(mu);
    seen = r;
    ZapReply reply;
    reply.user_id = CredentialsUserId(r.address);
    return reply;
  });
  {
    ZapPair p(ctx, path);
    ASSERT_TRUE(SendDealerRequest(p.dealer, "{}", /*dontwait=*/false).ok());
    ASSERT_TRUE(Readable(p.router, 5000));
    StatusOr<std::optional<RouterMessage>> m = RecvRouterMessage(p.router);
    ASSERT_TRUE(m.ok() && m->has_value());
    std::optional<PeerCredentials> cred = CredentialsOf((*m)->body);
    ASSERT_TRUE(cred.has_value());
    EXPECT_EQ(cred->uid, static_cast<uint32_t>(getuid()));
    EXPECT_EQ(cred->gid, static_cast<uint32_t>(getgid()));
    EXPECT_EQ(cred->pid, static_cast<uint32_t>(getpid()));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(seen.version, "1.0");
    EXPECT_FALSE(seen.request_id.empty());
    EXPECT_EQ(seen.domain, "zmq-frames-test");
    EXPECT_EQ(seen.mechanism, "NULL");
    EXPECT_TRUE(seen.credentials.empty());
  }
  EXPECT_EQ(zap.errors(), 0);
  unlink(path.c_str());
}

TEST(ZmqFramesTest, ZapRefusalKeepsThePeerOut) {
  const std::string path = SocketPath();
  zmq::context_t ctx;
  std::atomic<int> asked{0};
  ZapThread zap(ctx, [&](const ZapRequest&) {
    asked.fetch_add(1);
    ZapReply reply;
    reply.status_code = "400";
    reply.status_text = "no";
    return reply;
  });
  ZapPair p(ctx, path);
  ASSERT_TRUE(SendDealerRequest(p.dealer, "{}", /*dontwait=*/false).ok());
  EXPECT_FALSE(Readable(p.router, 500));
  EXPECT_GE(asked.load(), 1);
  EXPECT_EQ(zap.errors(), 0);
  unlink(path.c_str());
}

TEST(ZmqFramesTest, ServeZapRequestWithNothingWaitingDoesNothing) {
  zmq::context_t ctx;
  zmq::socket_t zap(ctx, zmq::socket_type::rep);
  zap.set(zmq::sockopt::linger, 0);
  zap.bind("inproc://zmq-frames-test-zap");
  bool called = false;
  EXPECT_TRUE(ServeZapRequest(zap, [&](const ZapRequest&) {
                called = true;
                return ZapReply();
              }).ok());
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace polykv::ipc

// ServeGuarded (daemon/src/serve_guarded.h): a handler's reply passes through, its exceptions
// become INTERNAL error replies naming the message type, and each request is counted once.
#include "serve_guarded.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

#include "metrics.h"
#include "pool_manager.h"

namespace polykv::daemon {
namespace {

ipc::Request MakeRequest(ipc::MessageType type, uint64_t id) {
  ipc::Request r;
  r.type = type;
  r.id = id;
  return r;
}

TEST(ServeGuardedTest, PassesTheHandlersReplyThrough) {
  const ipc::Request req = MakeRequest(ipc::MessageType::kList, 7);
  ipc::Reply reply = ServeGuarded(req, nullptr, [&] {
    ipc::Reply r;
    r.type = req.type;
    r.id = req.id;
    r.daemon_pid = 1234;
    return r;
  });
  EXPECT_TRUE(reply.ok);
  EXPECT_EQ(reply.id, 7u);
  EXPECT_EQ(reply.daemon_pid, 1234u);
}

TEST(ServeGuardedTest, StdExceptionBecomesAnInternalErrorNamingTheType) {
  const ipc::Request req = MakeRequest(ipc::MessageType::kAttach, 42);
  ipc::Reply reply =
      ServeGuarded(req, nullptr, []() -> ipc::Reply { throw std::runtime_error("boom"); });
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.type, ipc::MessageType::kAttach);
  EXPECT_EQ(reply.id, 42u);
  EXPECT_EQ(reply.code, "INTERNAL");
  EXPECT_EQ(reply.error, "internal error in ATTACH: boom");
}

TEST(ServeGuardedTest, AnyOtherExceptionToo) {
  const ipc::Request req = MakeRequest(ipc::MessageType::kRenew, 3);
  ipc::Reply reply = ServeGuarded(req, nullptr, []() -> ipc::Reply { throw 5; });
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.code, "INTERNAL");
  EXPECT_EQ(reply.error, "internal error in RENEW: unknown exception");
}

TEST(ServeGuardedTest, RecordsEachRequestInTheMetrics) {
  PoolManagerOptions o;
  o.backend = ipc::PoolMemory::kHost;
  o.shm_prefix = "/polykv-sg" + std::to_string(getpid()) + "-";
  PoolManager pools(std::move(o));
  Metrics metrics;
  const ipc::Request req = MakeRequest(ipc::MessageType::kAttach, 1);
  (void)ServeGuarded(req, &metrics, [&] {
    ipc::Reply r;
    r.type = req.type;
    r.id = req.id;
    return r;
  });
  (void)ServeGuarded(req, &metrics, []() -> ipc::Reply { throw std::logic_error("bad"); });
  const std::string text = metrics.Render(pools, nullptr);
  EXPECT_NE(text.find("polykv_requests_total{type=\"ATTACH\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("polykv_errors_total{code=\"INTERNAL\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("polykv_attach_duration_seconds_count 2\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace polykv::daemon

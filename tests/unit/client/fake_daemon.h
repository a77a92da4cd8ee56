// A scripted stand-in for polykvd (ROUTER socket on a temp ipc endpoint) for client tests
// that must not depend on the real daemon: stale replies, dropped requests, PROGRESS, leases.
#pragma once

#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "polykv/ipc/protocol.h"

namespace polykv::client::testing {

/// Serves requests on its own thread. `handler` returns the messages to send back in
/// order (PROGRESS messages, stale replies, the reply); an empty vector drops the request.
/// A Pause(ms) among them waits that long before the next one (nothing else is served
/// meanwhile, as a daemon busy with one request answers nothing else on it).
class FakeDaemon {
 public:
  using Handler = std::function<std::vector<ipc::Reply>(const ipc::Request&)>;

  explicit FakeDaemon(Handler handler) : handler_(std::move(handler)) {
    static std::atomic<int> counter{0};
    path_ = "/tmp/polykv-client-test-" + std::to_string(getpid()) + "-" +
            std::to_string(counter++) + ".sock";
    endpoint_ = "ipc://" + path_;
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(endpoint_);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeDaemon() {
    stop_ = true;
    thread_.join();
    socket_.close();
    ::unlink(path_.c_str());
  }
  const std::string& endpoint() const { return endpoint_; }
  /// Requests seen so far (all types).
  std::vector<ipc::Request> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int Count(ipc::MessageType type) const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& r : requests_) n += r.type == type;
    return n;
  }

  /// Not a message: the loop sleeps `ms` milliseconds at this point of the handler's list.
  static ipc::Reply Pause(int ms) {
    ipc::Reply r;
    r.type = ipc::MessageType::kError;
    r.stage = kPauseStage;
    r.done = ms;
    return r;
  }

  /// A successful reply echoing `req`'s type and id.
  static ipc::Reply OkReply(const ipc::Request& req) {
    ipc::Reply r;
    r.type = req.type;
    r.id = req.id;
    r.ok = true;
    return r;
  }
  /// A handler that answers every request with OkReply.
  static Handler AlwaysOk() {
    return [](const ipc::Request& req) { return std::vector<ipc::Reply>{OkReply(req)}; };
  }

 private:
  void Loop() {
    while (!stop_) {
      zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      while (true) {
        zmq::message_t m;
        if (!socket_.recv(m, zmq::recv_flags::dontwait)) break;
        bool more = m.more();
        frames.push_back(std::move(m));
        if (!more) break;
      }
      if (frames.size() < 2) continue;
      auto req = ipc::DecodeRequest(frames.back().to_string_view());
      if (!req.ok()) continue;
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(*req);
      }
      for (const ipc::Reply& reply : handler_(*req)) {
        if (reply.type == ipc::MessageType::kError && reply.stage == kPauseStage) {
          std::this_thread::sleep_for(std::chrono::milliseconds(reply.done));
          continue;
        }
        socket_.send(zmq::buffer(frames.front().to_string_view()), zmq::send_flags::sndmore);
        socket_.send(zmq::message_t(), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer(ipc::EncodeReply(reply)), zmq::send_flags::none);
      }
    }
  }

  static constexpr const char* kPauseStage = "fake-daemon-pause";
  Handler handler_;
  std::string path_, endpoint_;
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::router};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<ipc::Request> requests_;
  std::thread thread_;
};

}  // namespace polykv::client::testing

// The HTTP side of `polykv-cli agents serve`: an OpenAI-compatible server (cpp-httplib) in
// front of one model::BatchEngine. Every request becomes one engine session; its events
// come back through a per-request queue and go out whole or as server-sent events.
//
// Routes: POST /v1/completions, POST /v1/chat/completions (stream: "data: {chunk}\n\n" ...
// "data: [DONE]\n\n"), GET /v1/models, GET /health, GET /metrics (Prometheus text).
// A client that goes away is noticed by the next write to its socket (a streamed token, or
// a one-space keep-alive every second while a whole response is being generated) and its
// session is cancelled, freeing its KV before the next step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "polykv/model/batch_engine.h"
#include "polykv/status.h"
#include "serve/openai_api.h"

namespace httplib {
class Server;
}

namespace polykv::cli::serve {

/// The running HTTP server.
class OpenAiServer {
 public:
  /// Binds HOST:PORT (port 0: any free port) and starts serving on background threads
  /// (`http_threads` connections at once). `engine` and its model must outlive the server.
  /// Errors: kInvalidArgument for a malformed address, kUnavailable when it cannot bind.
  [[nodiscard]] static StatusOr<std::unique_ptr<OpenAiServer>> Start(const std::string& listen,
                                                                     model::BatchEngine& engine,
                                                                     ServeIdentity identity,
                                                                     int http_threads = 64);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  /// The bound port.
  int port() const { return port_; }
  /// Stops accepting and closes the listening socket (idempotent).
  void Stop();

 private:
  OpenAiServer() = default;
  void Routes();

  model::BatchEngine* engine_ = nullptr;
  ServeIdentity identity_;
  std::unique_ptr<httplib::Server> server_;
  std::string host_;
  int port_ = 0;
  int64_t started_ = 0;  ///< unix seconds
  struct Threads;
  std::unique_ptr<Threads> threads_;
};

}  // namespace polykv::cli::serve

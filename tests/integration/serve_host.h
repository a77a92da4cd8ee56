// `polykv-cli agents serve` as a child process for the integration tests (agents_serve_test,
// agents_cuda_test): started on a free port, stopped with SIGTERM; JSON POSTs to it.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace polykv::testing {

/// The host process: `polykv-cli agents serve` with `args` (after "serve"; "--listen
/// 127.0.0.1:0" added), its output in `dir`; port() is 0 (and the test failed) when it did
/// not start. Stopped with SIGTERM (Stop returns the exit code).
class ServeHost {
 public:
  ServeHost(const std::string& dir, const std::vector<std::string>& args) {
    out_ = dir + "/host.out";
    err_ = dir + "/host.err";
    std::vector<std::string> argv = {CliPath(), "agents", "serve", "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), args.begin(), args.end());
    Status s = proc_.Start(argv, out_, err_);
    EXPECT_TRUE(s.ok()) << s;
    const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 600 && port_ == 0 && proc_.running(); ++i) {
      std::smatch m;
      const std::string out = ReadFile(out_);
      if (std::regex_search(out, m, re)) port_ = std::stoi(m[1]);
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      proc_.Wait(0);
    }
    EXPECT_GT(port_, 0) << "host did not start: " << ReadFile(err_);
  }
  ~ServeHost() {
    if (proc_.running()) proc_.Stop(10000);
  }
  ServeHost(const ServeHost&) = delete;
  ServeHost& operator=(const ServeHost&) = delete;
  int Stop() { return proc_.Stop(20000); }
  int port() const { return port_; }
  std::string log() const { return ReadFile(out_) + ReadFile(err_); }

 private:
  Process proc_;
  std::string out_, err_;
  int port_ = 0;
};

/// POSTs `body` as JSON to `path`; *status = the HTTP status (-1: no answer).
inline nlohmann::json PostJson(int port, const std::string& path, const nlohmann::json& body,
                               int* status) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  if (!r) {
    *status = -1;
    return nlohmann::json();
  }
  *status = r->status;
  return nlohmann::json::parse(r->body, nullptr, false);
}

/// POSTs every body in `bodies` to `path` at once (a thread each); each answer must be 200.
inline std::vector<std::future<nlohmann::json>> PostConcurrently(
    int port, const std::string& path, const std::vector<nlohmann::json>& bodies) {
  std::vector<std::future<nlohmann::json>> answers;
  for (const nlohmann::json& body : bodies) {
    answers.push_back(std::async(std::launch::async, [port, path, body] {
      int status = 0;
      nlohmann::json j = PostJson(port, path, body, &status);
      EXPECT_EQ(status, 200) << j.dump();
      return j;
    }));
  }
  return answers;
}

}  // namespace polykv::testing

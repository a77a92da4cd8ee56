// A small agent process for the fault suite (attach storm, chaos): attaches a pool through
// the C API, checks it, decodes every layer and detaches, printing one JSON line. Needs no
// model. Usage:
//   polykv_fault_client ENDPOINT POOL_ID [--loops N] [--go-file PATH] [--timeout-ms T]
// --go-file: wait until PATH exists before attaching (so many processes start together).
// --loops: repeat the attach..detach cycle N times (0 = until killed).
// Exit status 0 when every cycle succeeded, 1 otherwise.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "polykv/client.h"

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void PrintError(const char* step, polykv_status s, double ms) {
  std::string msg = polykv_last_error();
  for (char& c : msg) {
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  std::printf("{\"ok\":false,\"step\":\"%s\",\"code\":\"%s\",\"error\":\"%s\",\"ms\":%.3f}\n", step,
              polykv_status_string(s), msg.c_str(), ms);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s ENDPOINT POOL_ID [--loops N] [--go-file PATH] [--timeout-ms T]\n",
                 argv[0]);
    return 2;
  }
  const std::string endpoint = argv[1], pool_id = argv[2];
  long loops = 1;
  int timeout_ms = 5000;
  std::string go_file;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--loops") == 0) loops = std::strtol(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--go-file") == 0) go_file = argv[i + 1];
    if (std::strcmp(argv[i], "--timeout-ms") == 0) timeout_ms = std::atoi(argv[i + 1]);
  }
  if (!go_file.empty()) {
    while (access(go_file.c_str(), F_OK) != 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (long n = 0; loops == 0 || n < loops; ++n) {
    const auto t0 = Clock::now();
    polykv_client* c = nullptr;
    polykv_status s = polykv_connect(endpoint.c_str(), timeout_ms, &c);
    if (s != POLYKV_OK) {
      PrintError("connect", s, MsSince(t0));
      return 1;
    }
    const double connect_ms = MsSince(t0);
    const auto t1 = Clock::now();
    polykv_pool* p = nullptr;
    s = polykv_attach(c, pool_id.c_str(), &p);
    const double attach_ms = MsSince(t1);
    if (s != POLYKV_OK) {
      PrintError("attach", s, attach_ms);
      polykv_disconnect(c);
      return 1;
    }
    const auto t2 = Clock::now();
    s = polykv_pool_verify(p);
    polykv_pool_info info = polykv_pool_info_init();
    if (s == POLYKV_OK) s = polykv_pool_get_info(p, &info);
    const size_t n_el = polykv_pool_layer_elements(p);
    std::vector<float> k(n_el), v(n_el);
    for (uint32_t l = 0; s == POLYKV_OK && l < info.layers; ++l) {
      s = polykv_decode_layer(p, l, k.data(), v.data(), POLYKV_DTYPE_F32);
    }
    const double decode_ms = MsSince(t2);
    if (s != POLYKV_OK) {
      PrintError("decode", s, decode_ms);
      polykv_detach(p);
      polykv_disconnect(c);
      return 1;
    }
    s = polykv_detach(p);
    polykv_disconnect(c);
    if (s != POLYKV_OK) {
      PrintError("detach", s, MsSince(t0));
      return 1;
    }
    std::printf("{\"ok\":true,\"connect_ms\":%.3f,\"attach_ms\":%.3f,\"decode_ms\":%.3f}\n",
                connect_ms, attach_ms, decode_ms);
    std::fflush(stdout);
  }
  return 0;
}

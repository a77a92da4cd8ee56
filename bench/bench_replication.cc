// bench_replication: pulling a Llama-3-8B-shaped pool region (32 layers, 8 KV heads, head_dim
// 128, 4096 tokens, codec k8v3) between hosts with UcxEngine (UCX ucp_get), for a grid of chunk
// sizes and pipelining depths. Two roles: `--serve --port P` holds and exposes the region and
// hands its descriptor to clients over a plain TCP socket; `--fetch HOST:PORT --reps N` pulls
// it N times per setting, verifies the checksum and prints a table of MB/s (2^20 bytes/s, as
// ucx_perftest counts). scripts/bench-replication.sh runs both across two network namespaces
// next to ucx_perftest's ucp_get bandwidth, the baseline of the same run.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "polykv/ipc/pool_layout.h"
#include "polykv/ipc/ucx_transfer.h"
#include "support/random.h"

namespace {

using Clock = std::chrono::steady_clock;
using polykv::ipc::UcxEngine;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_replication: %s\n", what.c_str());
  std::exit(1);
}

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = recv(fd, c, n, 0);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The pool shape of the benchmark: Llama-3-8B (32 layers, 8 KV heads, head_dim 128), 4096
// tokens, int8 keys + 3-bit values.
uint64_t PoolBytes() {
  polykv::ipc::PoolParams p;
  p.layers = 32;
  p.kv_heads = 8;
  p.head_dim = 128;
  p.tokens = 4096;
  p.codec = polykv::ipc::PoolCodec::kK8V;
  p.codec_config.key_bits = 8;
  p.codec_config.value_bits = 3;
  auto layout = polykv::ipc::ComputePoolLayout(p);
  if (!layout.ok()) Die("ComputePoolLayout: " + layout.status().ToString());
  return layout->total_bytes;
}

// Reply to a client: u32 descriptor length | descriptor | u64 size | u64 checksum.
int Serve(int port) {
  const uint64_t bytes = PoolBytes();
  std::vector<uint8_t> region(bytes);
  polykv::support::FillSplitMix64(region.data(), bytes, 0x5eed);
  const uint64_t checksum = polykv::ipc::Checksum64(region.data(), bytes);
  auto engine = UcxEngine::Create();
  if (!engine.ok()) Die("UcxEngine::Create: " + engine.status().ToString());
  auto exposure = (*engine)->Expose(region.data(), bytes);
  if (!exposure.ok()) Die("Expose: " + exposure.status().ToString());
  const std::string& desc = (*exposure)->descriptor();

  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) Die("socket");
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    Die("bind: " + std::to_string(port));
  if (listen(ls, 16) != 0) Die("listen");
  std::printf(
      "serving pool region %llu bytes, Checksum64 %016llx, descriptor %zu bytes, "
      "transports: %s, port %d\n",
      static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(checksum),
      desc.size(), (*engine)->transports().c_str(), port);
  std::printf("READY\n");
  std::fflush(stdout);
  for (;;) {
    int c = accept(ls, nullptr, nullptr);
    if (c < 0) continue;
    const uint32_t len = static_cast<uint32_t>(desc.size());
    (void)(WriteAll(c, &len, sizeof(len)) && WriteAll(c, desc.data(), desc.size()) &&
           WriteAll(c, &bytes, sizeof(bytes)) && WriteAll(c, &checksum, sizeof(checksum)));
    close(c);
  }
}

struct Served {
  std::string descriptor;
  uint64_t size = 0;
  uint64_t checksum = 0;
};

Served GetDescriptor(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) Die("--fetch wants HOST:PORT");
  const std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) Die("getaddrinfo " + host);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    const bool connected = s >= 0 && connect(s, res->ai_addr, res->ai_addrlen) == 0;
    freeaddrinfo(res);
    if (connected) {
      Served out;
      uint32_t len = 0;
      if (!ReadAll(s, &len, sizeof(len)) || len == 0 || len > (1u << 20)) Die("bad reply");
      out.descriptor.resize(len);
      if (!ReadAll(s, out.descriptor.data(), len) || !ReadAll(s, &out.size, sizeof(out.size)) ||
          !ReadAll(s, &out.checksum, sizeof(out.checksum))) {
        Die("truncated reply");
      }
      close(s);
      return out;
    }
    if (s >= 0) close(s);
    if (Clock::now() > deadline) Die("cannot connect to " + host_port);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int Fetch(const std::string& host_port, int reps) {
  const Served served = GetDescriptor(host_port);
  auto engine = UcxEngine::Create();
  if (!engine.ok()) Die("UcxEngine::Create: " + engine.status().ToString());
  std::vector<uint8_t> dst(served.size, 0);  // preallocated and touched once
  std::printf(
      "bench_replication: pool region %llu bytes (Llama-3-8B shape, 4096 tokens, k8v3), "
      "Checksum64 %016llx, %d reps per setting, requester transports: %s\n",
      static_cast<unsigned long long>(served.size),
      static_cast<unsigned long long>(served.checksum), reps, (*engine)->transports().c_str());
  const uint64_t chunks_mib[] = {1, 4, 16};
  const int depths[] = {1, 4, 8};
  struct Row {
    uint64_t chunk_mib;
    int depth;
    double median, min, max;
  };
  std::vector<Row> rows;
  for (uint64_t c : chunks_mib) {
    for (int depth : depths) {
      polykv::ipc::UcxPullOptions o;
      o.chunk_bytes = c << 20;
      o.max_outstanding = depth;
      std::vector<double> mbps;
      std::string per_rep;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        auto st = (*engine)->Pull(served.descriptor, dst.data(), dst.size(), o);
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!st.ok()) Die("Pull: " + st.ToString());
        const uint64_t sum = polykv::ipc::Checksum64(dst.data(), dst.size());
        if (sum != served.checksum) Die("checksum mismatch after a pull");
        std::memset(dst.data(), 0, 4096);  // the next rep must write it again
        mbps.push_back(static_cast<double>(dst.size()) / s / (1 << 20));
        char b[32];
        std::snprintf(b, sizeof(b), " %.0f", mbps.back());
        per_rep += b;
      }
      std::printf("chunk %2llu MiB, outstanding %d: MB/s per rep:%s\n",
                  static_cast<unsigned long long>(c), depth, per_rep.c_str());
      rows.push_back({c, depth, Median(mbps), *std::min_element(mbps.begin(), mbps.end()),
                      *std::max_element(mbps.begin(), mbps.end())});
    }
  }
  std::printf("%-10s %-11s %12s %10s %10s  (checksum verified after every rep)\n", "chunk MiB",
              "outstanding", "median MB/s", "min", "max");
  const Row* best = &rows[0];
  for (const Row& r : rows) {
    std::printf("%-10llu %-11d %12.1f %10.1f %10.1f\n",
                static_cast<unsigned long long>(r.chunk_mib), r.depth, r.median, r.min, r.max);
    if (r.median > best->median) best = &r;
  }
  const Row* def = nullptr;  // UcxPullOptions defaults: 4 MiB, 8 outstanding
  for (const Row& r : rows) {
    if (r.chunk_mib == 4 && r.depth == 8) def = &r;
  }
  // Machine-readable lines for scripts/bench-replication.sh.
  std::printf("RESULT best_median_mbps %.1f chunk_mib %llu outstanding %d\n", best->median,
              static_cast<unsigned long long>(best->chunk_mib), best->depth);
  if (def != nullptr) std::printf("RESULT default_median_mbps %.1f\n", def->median);
  std::printf("RESULT region_bytes %llu\n", static_cast<unsigned long long>(served.size));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_replication: UCX pulls of a Llama-3-8B-shaped pool region"};
  bool serve = false;
  int port = 0;
  std::string fetch;
  int reps = 5;
  app.add_flag("--serve", serve, "hold and expose the region; hand out its descriptor on --port");
  app.add_option("--port", port, "TCP port of the descriptor service (with --serve)");
  app.add_option("--fetch", fetch, "HOST:PORT of a --serve instance: pull and measure");
  app.add_option("--reps", reps, "pulls per setting (with --fetch)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (serve == !fetch.empty()) Die("give exactly one of --serve or --fetch");
  if (serve) {
    if (port <= 0 || port > 65535) Die("--serve needs --port 1..65535");
    return Serve(port);
  }
  if (reps < 1) Die("--reps must be >= 1");
  return Fetch(fetch, reps);
}

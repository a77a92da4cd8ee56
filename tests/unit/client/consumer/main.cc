// Consumer of the installed package: C API + header-only C++ wrapper, no daemon needed.
#include <polykv/client.h>

#include <cstdio>
#include <cstring>
#include <polykv/client.hpp>

int main(int argc, char** argv) {
  if (std::strcmp(polykv_status_string(POLYKV_DATA_LOSS), "DATA_LOSS") != 0) return 2;
  const char* endpoint = argc > 1 ? argv[1] : "ipc:///tmp/polykv-consumer-none.sock";
  auto client = polykv::client::Client::Connect(endpoint, 50);
  if (client.ok() || client.status().code() != polykv::client::StatusCode::kUnavailable) return 3;
  std::printf("consumer ok: %s\n", client.status().ToString().c_str());
  return 0;
}

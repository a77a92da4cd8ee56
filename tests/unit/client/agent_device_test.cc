// The agent's device seam on the CPU: --device parsing, the pool routing table, and a
// PooledAgent against a scripted daemon whose pool lies in CUDA memory (no device needed):
// without --allow-copy it fails before attaching anything; nothing falls back silently.
#include "polykv/agent_device.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fake_daemon.h"
#include "polykv/agent.h"
#include "polykv/ipc/protocol.h"
#include "polykv/kernels/device_ops.h"

namespace polykv::client {
namespace {

using absl::StatusCode;
using kernels::Device;
using testing::FakeDaemon;

TEST(AgentDeviceTest, ParsesCpuCudaAndOrdinals) {
  struct Case {
    const char* text;
    Device kind;
    int index;
  };
  for (const Case& c : {Case{"cpu", Device::kCpu, 0}, Case{"cuda", Device::kCuda, 0},
                        Case{"cuda:0", Device::kCuda, 0}, Case{"cuda:3", Device::kCuda, 3},
                        Case{"cuda:1023", Device::kCuda, 1023}}) {
    auto d = ParseAgentDevice(c.text);
    ASSERT_TRUE(d.ok()) << c.text << ": " << d.status();
    EXPECT_EQ(d->kind, c.kind) << c.text;
    EXPECT_EQ(d->index, c.index) << c.text;
  }
  EXPECT_EQ(AgentDeviceName(*ParseAgentDevice("cuda")), "cuda:0");
  EXPECT_EQ(AgentDeviceName(*ParseAgentDevice("cuda:7")), "cuda:7");
  EXPECT_EQ(AgentDeviceName(*ParseAgentDevice("cpu")), "cpu");
}

TEST(AgentDeviceTest, RejectsMalformedDevices) {
  for (const char* text : {"", "gpu", "CUDA", "cpu:0", "cuda:", "cuda:-1", "cuda:1x", "cuda: 1",
                           "cuda:1024", "cuda:99999", "cuda:0:1", "cuda0"}) {
    auto d = ParseAgentDevice(text);
    ASSERT_FALSE(d.ok()) << "'" << text << "' parsed";
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(d.status().message().find("expected cpu, cuda or cuda:N"), std::string::npos)
        << d.status();
  }
}

RouteInput Input(const char* device, const char* backend) {
  RouteInput in;
  in.device = *ParseAgentDevice(device);
  in.backend = backend;
  in.pool_id = "p00l";
  return in;
}

TEST(AgentDeviceTest, RoutesEveryDeviceAndBackend) {
  // cpu + host: in place when asked and the weights are mapped, else decoded (host to host).
  EXPECT_EQ(*RoutePool(Input("cpu", "host")), PoolRoute::kHostInPlace);
  RouteInput in = Input("cpu", "host");
  in.in_place = false;
  EXPECT_EQ(*RoutePool(in), PoolRoute::kHostDecoded);
  in = Input("cpu", "host");
  in.mapped_weights = false;
  EXPECT_EQ(*RoutePool(in), PoolRoute::kHostDecoded);
  // cpu + cuda: refused, whatever the attend mode, unless allow_copy.
  for (bool in_place : {true, false}) {
    in = Input("cpu", "cuda");
    in.in_place = in_place;
    auto r = RoutePool(in);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    in.allow_copy = true;
    EXPECT_EQ(*RoutePool(in), PoolRoute::kCudaCopiedToHost);
  }
  // cuda + cuda: in place; decompressed is refused.
  EXPECT_EQ(*RoutePool(Input("cuda:1", "cuda")), PoolRoute::kCudaInPlace);
  in = Input("cuda", "cuda");
  in.in_place = false;
  EXPECT_EQ(RoutePool(in).status().code(), StatusCode::kFailedPrecondition);
  // cuda + host: refused (even with allow_copy: there is no host-to-device copy path).
  in = Input("cuda", "host");
  in.allow_copy = true;
  auto r = RoutePool(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--backend cuda"), std::string::npos) << r.status();
  // Unknown backends are bad input.
  EXPECT_EQ(RoutePool(Input("cpu", "tpu")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RoutePool(Input("cpu", "")).status().code(), StatusCode::kInvalidArgument);
}

TEST(AgentDeviceTest, RefusalNamesPoolBackendAndFlag) {
  auto r = RoutePool(Input("cpu", "cuda"));
  ASSERT_FALSE(r.ok());
  const std::string msg(r.status().message());
  for (const char* part : {"pool p00l", "backend cuda", "--device cpu", "--allow-copy",
                           "AgentOptions::allow_copy", "--device cuda"}) {
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  }
}

TEST(AgentDeviceTest, CopyCostLineStatesBytes) {
  const std::string line = CopyCostLine("abc", 3 * 1048576ull, 48 * 1048576ull + 524288);
  EXPECT_NE(line.find("pool abc"), std::string::npos) << line;
  EXPECT_NE(line.find("3.0 MiB of compressed KV"), std::string::npos) << line;
  EXPECT_NE(line.find("private host cache of 48.5 MiB"), std::string::npos) << line;
  EXPECT_NE(line.find("--allow-copy"), std::string::npos) << line;
}

// ---- PooledAgent against a scripted daemon that serves one pool in CUDA memory ----

const std::string kPool(64, 'c');

std::string ModelPath() { return std::string(POLYKV_TEST_DATA_DIR) + "/models/stories260K"; }

/// A daemon whose only pool has backend "cuda"; ATTACH answers NOT_FOUND (the test machine
/// could not map CUDA memory anyway): reaching it shows the agent went on to attach.
FakeDaemon CudaPoolDaemon(std::string backend = "cuda") {
  return FakeDaemon([backend](const ipc::Request& req) -> std::vector<ipc::Reply> {
    if (req.type == ipc::MessageType::kStats) {
      ipc::Reply r = FakeDaemon::OkReply(req);
      ipc::PoolInfo p;
      p.id = kPool;
      p.backend = backend;
      p.codec = "k8v3";
      p.tokens = 16;
      p.layers = 5;
      p.kv_heads = 4;
      p.head_dim = 8;
      r.pool = p;
      return {r};
    }
    if (req.type == ipc::MessageType::kAttach) {
      return {ipc::ErrorReply(req.type, req.id, absl::NotFoundError("fake: attach refused"))};
    }
    return {FakeDaemon::OkReply(req)};
  });
}

StatusOr<std::unique_ptr<PooledAgent>> MakeAgent(const std::string& endpoint, bool allow_copy) {
  AgentOptions o;
  o.model_path = ModelPath();
  o.endpoint = endpoint;
  o.timeout_ms = 2000;
  o.threads = 1;
  o.load.weights = model::WeightStorage::kMapped;
  o.allow_copy = allow_copy;
  return PooledAgent::Create(o);
}

// In *s, the status of a 2-token Run of prompt {1, 2, 3} on kPool by an agent of `endpoint`
// (MakeAgent), which must be created.
void RunOnPool(const std::string& endpoint, bool allow_copy, Status* s) {
  auto agent = MakeAgent(endpoint, allow_copy);
  ASSERT_TRUE(agent.ok()) << agent.status();
  model::SamplingOptions sampling;
  sampling.max_new_tokens = 2;
  *s = (*agent)->Run(kPool, std::vector<int32_t>{1, 2, 3}, sampling).status();
}

TEST(AgentDeviceTest, CpuAgentRefusesCudaPoolBeforeAttaching) {
  FakeDaemon daemon = CudaPoolDaemon();
  auto agent = MakeAgent(daemon.endpoint(), /*allow_copy=*/false);
  ASSERT_TRUE(agent.ok()) << agent.status();
  model::SamplingOptions sampling;
  sampling.max_new_tokens = 2;
  const std::vector<int32_t> prompt = {1, 2, 3};
  for (int i = 0; i < 2; ++i) {  // Run and Score route the same way
    Status s = i == 0 ? (*agent)->Run(kPool, prompt, sampling).status()
                      : (*agent)->Score(kPool, prompt, prompt).status();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    const std::string msg(s.message());
    EXPECT_NE(msg.find("pool " + kPool), std::string::npos) << msg;
    EXPECT_NE(msg.find("backend cuda"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--allow-copy"), std::string::npos) << msg;
  }
  // Refused from the pool's STATS: nothing was attached (no CUDA mapping, no lease).
  EXPECT_EQ(daemon.Count(ipc::MessageType::kStats), 2);
  EXPECT_EQ(daemon.Count(ipc::MessageType::kAttach), 0);
}

TEST(AgentDeviceTest, AllowCopyLetsACpuAgentAttachACudaPool) {
  FakeDaemon daemon = CudaPoolDaemon();
  Status s;
  ASSERT_NO_FATAL_FAILURE(RunOnPool(daemon.endpoint(), /*allow_copy=*/true, &s));
  ASSERT_FALSE(s.ok());
  // Past the routing: the agent attached, and the (fake) daemon's answer is what surfaces.
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("fake: attach refused"), std::string::npos) << s;
  EXPECT_GE(daemon.Count(ipc::MessageType::kAttach), 1);
}

TEST(AgentDeviceTest, APoolWithoutABackendYetIsDecidedAfterAttaching) {
  // A persisted pool the daemon has not restored yet reports backend "" in STATS: the agent
  // attaches (and decides from the mapping) instead of refusing it as unknown.
  FakeDaemon daemon = CudaPoolDaemon("");
  Status s;
  ASSERT_NO_FATAL_FAILURE(RunOnPool(daemon.endpoint(), /*allow_copy=*/false, &s));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  EXPECT_EQ(daemon.Count(ipc::MessageType::kAttach), 1);
}

TEST(AgentDeviceTest, CudaAgentNeverRunsOnTheCpu) {
  // The device is checked before the model is loaded: a model path that does not exist
  // shows the device error comes first (and that no CPU model was set up instead).
  AgentOptions o;
  o.model_path = "/nonexistent/model";
  o.device = *ParseAgentDevice("cuda:0");
  auto agent = PooledAgent::Create(o);
  ASSERT_FALSE(agent.ok());
  const StatusCode code = agent.status().code();
  if (kernels::CudaDeviceCount() == 0) {
    // No device (or no CUDA build): the device's own error, before the model is looked at.
    EXPECT_TRUE(code == StatusCode::kUnimplemented || code == StatusCode::kFailedPrecondition)
        << agent.status();
    EXPECT_EQ(code, kernels::CheckDeviceAvailable(Device::kCuda).code());
    EXPECT_EQ(std::string(agent.status().message()).find("/nonexistent/model"), std::string::npos)
        << agent.status();
  } else {
    // A device: the model is loaded for it, and the missing file is the error.
    EXPECT_EQ(code, StatusCode::kNotFound) << agent.status();
  }
  // An ordinal past the devices present is refused too.
  o.device = *ParseAgentDevice("cuda:1023");
  agent = PooledAgent::Create(o);
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.status().code(), StatusCode::kOk);
}

}  // namespace
}  // namespace polykv::client

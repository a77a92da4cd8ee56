// End to end on a GPU (label gpu; skips without a CUDA device): polykvd --backend cuda
// publishes a stories260K pool in device memory; `polykv-cli agent --device cuda` processes
// attend to it in place (route cuda-in-place) and answer as a CPU agent that copied the pool
// (--allow-copy, which logs its cost); a CPU agent without --allow-copy is refused with
// FAILED_PRECONDITION; two cuda agents at once give the same answer; a pool tree on the cuda
// backend is attended in place (two segments), its child prefilled on the host (the parent
// read back, logged) or with --prefill-device cuda on the GPU in place (no read-back); `agents
// serve --device cuda` (batched sessions on the GPU over the same pool, in place) answers as
// single cuda agents do.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "polykv/kernels/device_ops.h"
#include "serve_host.h"

namespace polykv::testing {
namespace {

using nlohmann::json;

class AgentsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status dev = kernels::CheckDeviceAvailable(kernels::Device::kCuda);
    if (!dev.ok()) GTEST_SKIP() << "no CUDA device: " << dev.message();
    if (!fs::exists(DaemonPath()) || !fs::exists(CliPath()))
      GTEST_SKIP() << "polykvd or polykv-cli not built";
    endpoint_ = "ipc://" + dir_.path() + "/control.sock";
    std::vector<std::string> args = {DaemonPath(),
                                     "--endpoint",
                                     endpoint_,
                                     "--backend",
                                     "cuda",
                                     "--lease-seconds",
                                     "5",
                                     "--log-level",
                                     "info",
                                     "--shm-prefix",
                                     NextDaemonPrefix(),
                                     "--prefill-device",
                                     PrefillDevice()};
    ASSERT_TRUE(daemon_.Start(args, dir_.File("polykvd.out"), dir_.File("polykvd.err")).ok());
    for (int i = 0; i < 300; ++i) {
      polykv_client* c = nullptr;
      if (polykv_connect(endpoint_.c_str(), 500, &c) == POLYKV_OK) {
        polykv_disconnect(c);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::vector<int32_t> doc(400);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = 1 + static_cast<int32_t>(i * 53 % 500);
    ProcessResult r = RunProcess({CliPath(), "pools", "--json", "--endpoint", endpoint_, "create",
                                  "--model", StoriesPath(), "--token-ids", JoinIds(doc)},
                                 dir_.path(), 120000);
    ASSERT_EQ(r.exit_code, 0) << r.err << ReadFile(dir_.File("polykvd.err"));
    pool_ = json::parse(r.out)["id"].get<std::string>();
  }
  /// Where the daemon prefills documents (--prefill-device).
  virtual std::string PrefillDevice() const { return "host"; }
  void TearDown() override {
    if (daemon_.running()) {
      EXPECT_EQ(daemon_.Stop(10000), 0);
    }
  }
  std::vector<std::string> Agent(const std::string& device, bool allow_copy,
                                 const std::string& prompt_ids = "403,407,261") const {
    std::vector<std::string> v = {CliPath(),      "agent",        "--pool",           pool_,
                                  "--model",      StoriesPath(),  "--endpoint",       endpoint_,
                                  "--prompt-ids", prompt_ids,     "--device",         device,
                                  "--json",       "--ignore-eos", "--max-new-tokens", "32"};
    if (allow_copy) v.push_back("--allow-copy");
    return v;
  }
  // Creates a 90-token child of pool_ (published on the cuda backend); a cuda agent on it
  // attends to parent + child in place (two segments) and answers as a CPU agent that copied
  // both pools (--allow-copy).
  void CreateChildAndCompareAgents() {
    std::vector<int32_t> tail(90);
    for (size_t i = 0; i < tail.size(); ++i) tail[i] = 1 + static_cast<int32_t>(i * 31 % 500);
    ProcessResult r =
        RunProcess({CliPath(), "pools", "--json", "--endpoint", endpoint_, "create", "--model",
                    StoriesPath(), "--token-ids", JoinIds(tail), "--parent", pool_},
                   dir_.path(), 120000);
    ASSERT_EQ(r.exit_code, 0) << r.err << ReadFile(dir_.File("polykvd.err"));
    const json created = json::parse(r.out);
    const std::string child = created["id"].get<std::string>();
    EXPECT_EQ(created["backend"], "cuda") << r.out;
    auto agent = [&](const std::string& device, bool allow_copy) {
      std::vector<std::string> v = Agent(device, allow_copy);
      v[3] = child;  // --pool
      return v;
    };
    ProcessResult gpu = RunProcess(agent("cuda", false), dir_.path(), 120000);
    ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
    ProcessResult cpu = RunProcess(agent("cpu", true), dir_.path(), 120000);
    ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
    const json g = json::parse(gpu.out), c = json::parse(cpu.out);
    EXPECT_EQ(g["route"], "cuda-in-place");
    EXPECT_EQ(g["answer_ids"], c["answer_ids"]);
    EXPECT_EQ(g["answer_ids"].size(), 32u);
  }
  TempDir dir_;
  support::Process daemon_;
  std::string endpoint_, pool_;
};

TEST_F(AgentsCuda, CudaAgentAttendsInPlaceAndAnswersAsACopyingCpuAgent) {
  ProcessResult gpu = RunProcess(Agent("cuda", false), dir_.path(), 120000);
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  const json g = json::parse(gpu.out);
  EXPECT_EQ(g["route"], "cuda-in-place");
  EXPECT_GT(g["stats"]["device_bytes"].get<uint64_t>(), 0u);
  ProcessResult cpu = RunProcess(Agent("cpu", true), dir_.path(), 120000);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const json c = json::parse(cpu.out);
  EXPECT_EQ(c["route"], "cuda-copied-to-host");
  EXPECT_NE(cpu.err.find("--allow-copy: pool " + pool_), std::string::npos) << cpu.err;
  EXPECT_EQ(g["answer_ids"], c["answer_ids"]);
  EXPECT_EQ(g["answer_ids"].size(), 32u);
}

TEST_F(AgentsCuda, CpuAgentWithoutAllowCopyIsRefused) {
  ProcessResult cpu = RunProcess(Agent("cpu", false), dir_.path(), 120000);
  EXPECT_NE(cpu.exit_code, 0);
  EXPECT_NE(cpu.err.find("FAILED_PRECONDITION"), std::string::npos) << cpu.err;
  EXPECT_NE(cpu.err.find("--allow-copy"), std::string::npos) << cpu.err;
}

TEST_F(AgentsCuda, TwoCudaAgentsOnOnePoolAtOnce) {
  support::Process a, b;
  ASSERT_TRUE(a.Start(Agent("cuda", false), dir_.File("a.out"), dir_.File("a.err")).ok());
  ASSERT_TRUE(b.Start(Agent("cuda", false), dir_.File("b.out"), dir_.File("b.err")).ok());
  ASSERT_TRUE(a.Wait(120000));
  ASSERT_TRUE(b.Wait(120000));
  ASSERT_EQ(a.exit_code(), 0) << ReadFile(dir_.File("a.err"));
  ASSERT_EQ(b.exit_code(), 0) << ReadFile(dir_.File("b.err"));
  EXPECT_EQ(json::parse(ReadFile(dir_.File("a.out")))["answer_ids"],
            json::parse(ReadFile(dir_.File("b.out")))["answer_ids"]);
}

// A pool tree on the cuda backend, the host prefilling: a child of the cuda pool (the daemon
// reads the parent back, saying so in its log, to prefill the child on the host, then
// publishes the child in GPU memory); a cuda agent on the child attends to parent + child in
// place (two segments) and answers as a CPU agent that copied both pools.
TEST_F(AgentsCuda, PoolTreeOnTheDeviceAnswersAsACopyingCpuAgent) {
  ASSERT_NO_FATAL_FAILURE(CreateChildAndCompareAgents());
  EXPECT_NE(ReadFile(dir_.File("polykvd.err"))
                .find("read back from GPU memory: the host prefills its child (--prefill-device "
                      "cuda would attend to it in place)"),
            std::string::npos);
}

// The daemon prefilling on the GPU (--prefill-device cuda): the root pool prefilled and
// encoded there, its child prefilled there attending to the parent's device copy in place
// (no read-back: the log says none); agents on the child as above.
class AgentsCudaGpuPrefill : public AgentsCuda {
 protected:
  std::string PrefillDevice() const override { return "cuda"; }
};

TEST_F(AgentsCudaGpuPrefill, ChildPrefilledOnTheDeviceAnswersAsACopyingCpuAgent) {
  ASSERT_NO_FATAL_FAILURE(CreateChildAndCompareAgents());
  const std::string log = ReadFile(dir_.File("polykvd.err"));
  EXPECT_NE(log.find("on CUDA device 0"), std::string::npos) << log;
  EXPECT_EQ(log.find("the host prefills its child"), std::string::npos) << log;
}

// Three requests at once to `agents serve --device cuda`: one batched step per token on the
// GPU, each answer equal to a single cuda agent's; a request past the session slots' positions
// is refused (HTTP 400), not truncated; SIGTERM ends the host cleanly.
TEST_F(AgentsCuda, ServeOnTheDeviceAnswersAsSingleCudaAgents) {
  ServeHost host(dir_.path(), {"--pool", pool_, "--model", StoriesPath(), "--endpoint", endpoint_,
                               "--device", "cuda", "--alias", "doc", "--session-positions", "64"});
  ASSERT_GT(host.port(), 0);
  const std::vector<std::vector<int32_t>> prompts = {{403, 407, 261}, {12, 99}, {7, 8, 9, 10, 11}};
  std::vector<json> bodies;
  for (const auto& p : prompts)
    bodies.push_back({{"model", "doc"},
                      {"prompt", p},
                      {"max_tokens", 32},
                      {"temperature", 0},
                      {"ignore_eos", true},
                      {"return_token_ids", true}});
  auto answers = PostConcurrently(host.port(), "/v1/completions", bodies);
  for (size_t i = 0; i < answers.size(); ++i) {
    const json j = answers[i].get();
    ASSERT_TRUE(j.contains("choices")) << j.dump() << host.log();
    ProcessResult single =
        RunProcess(Agent("cuda", false, JoinIds(prompts[i])), dir_.path(), 120000);
    ASSERT_EQ(single.exit_code, 0) << single.err;
    EXPECT_EQ(j["choices"][0]["token_ids"], json::parse(single.out)["answer_ids"])
        << "prompt " << i;
  }
  int status = 0;
  const json too_long =
      PostJson(host.port(), "/v1/completions",
               {{"model", "doc"}, {"prompt", prompts[0]}, {"max_tokens", 100}}, &status);
  EXPECT_EQ(status, 400) << too_long.dump();
  EXPECT_EQ(host.Stop(), 0) << host.log();
}

}  // namespace
}  // namespace polykv::testing

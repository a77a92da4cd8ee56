// `polykv-cli agents serve`: one process hosting many agent sessions over one pool, decoded
// in batches (model::BatchEngine: continuous batching, ForwardBatch), behind an
// OpenAI-compatible HTTP endpoint (serve/server.h). Runs until SIGINT or SIGTERM.
// --device cuda: the sessions run on that GPU (model::NewCudaBatchModel) over the daemon's
// cuda pool attended in place; a host pool, or a cuda pool for --device cpu, is an error.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "commands.h"
#include "polykv/agent.h"
#include "polykv/agent_device.h"
#include "polykv/model/batch_engine.h"
#include "polykv/model/cuda_llama.h"
#include "polykv/status.h"
#include "serve/server.h"

namespace polykv::cli {
namespace {

struct ServeArgs {
  std::string pool;
  std::string model;
  std::string listen = "127.0.0.1:8080";
  std::string alias;  // default: the pool id
  std::string endpoint;
  int timeout_ms = 5000;
  int threads = 0;
  int max_sessions = 64;
  int default_max_tokens = 256;
  int http_threads = 64;
  int min_step_ms = 0;
  int64_t max_prompt_rows = model::BatchEngineOptions().max_prompt_rows;
  std::string device = "cpu";
  int64_t session_positions = 1024;  // --device cuda: own positions per session slot
};

// SIGINT / SIGTERM end the host: the handler (any thread may run it) writes to a pipe that
// Serve waits on.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  (void)!write(g_signal_pipe[1], &c, 1);
}

Status Serve(const ServeArgs& a) {
  if (pipe(g_signal_pipe) != 0) return absl::InternalError("pipe failed");
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that goes away must not kill the host

  client::AgentOptions o;
  o.model_path = a.model;
  o.endpoint = a.endpoint;
  o.timeout_ms = a.timeout_ms;
  o.threads = a.threads;
  POLYKV_ASSIGN_OR_RETURN(o.device, client::ParseAgentDevice(a.device));
  POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<client::PooledAgent> agent,
                          client::PooledAgent::Create(o));
  POLYKV_ASSIGN_OR_RETURN(client::SharedPool pool, agent->AttachShared(a.pool));
  model::BatchEngineOptions eo;
  eo.max_prompt_rows = a.max_prompt_rows;
  eo.max_sessions = a.max_sessions;
  eo.min_step_ms = a.min_step_ms;
  const int64_t cached = static_cast<int64_t>(pool.token_ids.size());
  std::unique_ptr<model::BatchEngine> engine;
  if (pool.device.kind == kernels::Device::kCuda) {
    // One slot of session_positions own positions per session: Submit refuses a request
    // that would not fit (prefix + prompt + max_tokens beyond it).
    POLYKV_ASSIGN_OR_RETURN(std::unique_ptr<model::BatchModel> bm,
                            model::NewCudaBatchModel(*agent->cuda_model(), pool.prefix,
                                                     a.max_sessions, a.session_positions));
    const int64_t window = agent->cuda_model()->config().max_positions;
    eo.max_context = cached + a.session_positions - 1;
    if (window > 0) eo.max_context = std::min(eo.max_context, window);
    engine = std::make_unique<model::BatchEngine>(std::move(bm), pool.prefix_bytes_per_step, eo);
    std::printf("polykv agents serve: sessions on %s (%d slots of %lld positions)\n",
                client::AgentDeviceName(pool.device).c_str(), a.max_sessions,
                static_cast<long long>(a.session_positions));
  } else {
    engine = std::make_unique<model::BatchEngine>(
        agent->model(), pool.prefix, std::move(pool.token_ids), pool.prefix_bytes_per_step, eo);
  }
  pool.prefix.reset();  // the engine holds it (and with it the attachment)
  std::thread engine_thread([&] { engine->RunUntilStopped(); });
  serve::ServeIdentity id;
  id.model_alias = a.alias.empty() ? a.pool : a.alias;
  id.pool_id = a.pool;
  id.default_max_tokens = a.default_max_tokens;
  auto server = serve::OpenAiServer::Start(a.listen, *engine, id, a.http_threads);
  if (!server.ok()) {
    engine->Shutdown();
    engine_thread.join();
    return server.status();
  }
  std::printf(
      "polykv agents serve: listening on http://%s:%d (model '%s', pool %s, codec %s, %lld "
      "cached tokens, up to %d sessions per step)\n",
      a.listen.substr(0, a.listen.rfind(':')).c_str(), (*server)->port(), id.model_alias.c_str(),
      a.pool.c_str(), pool.codec.c_str(), static_cast<long long>(cached), a.max_sessions);
  std::fflush(stdout);
  char sig = 0;
  while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
  }
  std::printf("polykv agents serve: signal %d, stopping\n", static_cast<int>(sig));
  std::fflush(stdout);
  // Sessions still running end now (their clients get finish "stop"), then the server stops
  // once every response is written.
  engine->Shutdown();
  engine_thread.join();
  (*server)->Stop();
  server->reset();
  engine.reset();  // detaches the pool (the agent's connection is still open)
  return absl::OkStatus();
}

}  // namespace

void RegisterAgentsServeCommand(CLI::App& agents) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* c = agents.add_subcommand(
      "serve",
      "Host many agent sessions over one pool in one process (batched decode) behind an "
      "OpenAI-compatible HTTP endpoint");
  c->add_option("--pool", args->pool, "pool id")->required();
  c->add_option("--model", args->model, "the pool's model")->required();
  c->add_option("--listen", args->listen, "HOST:PORT to listen on (port 0: any free port)");
  c->add_option("--alias", args->alias, "model name listed by /v1/models (default: the pool id)");
  AddDaemonOptions(c, &args->endpoint, &args->timeout_ms);
  AddThreadsOption(c, &args->threads, "compute threads (0 = all cores)");
  c->add_option("--max-sessions", args->max_sessions, "sessions decoded per step (more wait)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--default-max-tokens", args->default_max_tokens,
                "max_tokens of a request that gives none")
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--http-threads", args->http_threads, "HTTP connections served at once")
      ->check(CLI::Range(2, 4096));
  c->add_option("--max-prompt-rows", args->max_prompt_rows,
                "prompt rows of joining sessions run as one forward (0: one forward per session)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  c->add_option("--device", args->device,
                "cpu (default), cuda or cuda:N: where the sessions compute; cuda attends to the "
                "daemon's cuda pool in place (no silent CPU fallback)");
  c->add_option("--session-positions", args->session_positions,
                "--device cuda: own positions per session (prompt + answer), reserved per slot")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  c->add_option("--min-step-ms", args->min_step_ms,
                "pace decode steps to at least this many ms (tests, demos; 0 = full speed)")
      ->check(CLI::Range(0, 60000));
  c->callback([args] {
    if (Status s = Serve(*args); !s.ok()) FailWith(s);
  });
}

}  // namespace polykv::cli

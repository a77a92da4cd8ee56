// OpenAiServer: cpp-httplib routes in front of a model::BatchEngine.
#include "serve/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace polykv::cli::serve {
namespace {

using nlohmann::json;

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(ErrorJson(e).dump(), "application/json");
}

// One request's session: the engine's events, queued for the HTTP thread.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<model::SessionEvent> events;
  std::atomic<bool> gone{false};  // the client went away: the session is cancelled
  std::atomic<bool> done{false};  // the last event was queued
  uint64_t id = 0;

  // Waits up to `wait` for events; returns those queued.
  std::deque<model::SessionEvent> Take(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, wait, [&] { return !events.empty(); });
    std::deque<model::SessionEvent> out;
    out.swap(events);
    return out;
  }
};

// An engine error as an API error (Submit, or a failed step).
ApiError EngineError(const Status& s) {
  ApiError e;
  e.message = std::string(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      e.http_status = 400;
      break;
    case absl::StatusCode::kOutOfRange:
      e.http_status = 400;
      e.code = "context_length_exceeded";
      break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kNotFound:
      e.http_status = 503;
      e.type = "server_error";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
  }
  return e;
}

std::string Sse(const json& j) { return absl::StrCat("data: ", j.dump(), "\n\n"); }

// The engine's counters in the Prometheus text format.
std::string MetricsText(const model::BatchEngine& engine) {
  const model::BatchEngineStats s = engine.stats();
  std::string out;
  const auto metric = [&out](const char* name, const char* type, const char* help, double v) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ",
                    v, "\n");
  };
  metric("polykv_host_sessions_running", "gauge", "Sessions decoding now.", s.running);
  metric("polykv_host_sessions_waiting", "gauge", "Sessions queued.", s.waiting);
  metric("polykv_host_sessions_submitted_total", "counter", "Sessions submitted.",
         s.sessions_submitted);
  metric("polykv_host_sessions_finished_total", "counter", "Sessions finished.",
         s.sessions_finished);
  metric("polykv_host_sessions_cancelled_total", "counter", "Sessions cancelled.",
         s.sessions_cancelled);
  metric("polykv_host_steps_total", "counter", "Batched decode steps.", s.steps);
  metric("polykv_host_step_rows_total", "counter", "Sessions summed over steps.", s.step_rows);
  metric("polykv_host_prompt_tokens_total", "counter", "Prompt tokens fed.", s.prompt_tokens);
  metric("polykv_host_generated_tokens_total", "counter", "Tokens sampled.", s.generated_tokens);
  metric("polykv_host_decode_seconds_total", "counter", "Time in batched steps.", s.decode_seconds);
  metric("polykv_host_prefill_seconds_total", "counter", "Time in prompt forwards.",
         s.prefill_seconds);
  metric("polykv_host_prompt_forwards_total", "counter",
         "Prompt forwards (each over the prompts of the sessions admitted together).",
         s.prompt_forwards);
  metric("polykv_host_weight_bytes_per_step", "gauge", "Weight bytes read per step.",
         static_cast<double>(s.weight_bytes_per_step));
  metric("polykv_host_prefix_bytes_per_step", "gauge", "Pool bytes read per step.",
         static_cast<double>(s.prefix_bytes_per_step));
  return out;
}

}  // namespace

struct OpenAiServer::Threads {
  std::thread listen;
  std::atomic<uint64_t> next_request{1};
};

StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(const std::string& listen,
                                                            model::BatchEngine& engine,
                                                            ServeIdentity identity,
                                                            int http_threads) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("--listen \"", listen, "\" must be HOST:PORT, e.g. 127.0.0.1:8080"));
  std::unique_ptr<OpenAiServer> s(new OpenAiServer());
  s->engine_ = &engine;
  s->identity_ = std::move(identity);
  s->host_ = listen.substr(0, colon);
  s->started_ = UnixNow();
  s->threads_ = std::make_unique<Threads>();
  s->server_ = std::make_unique<httplib::Server>();
  const size_t n = static_cast<size_t>(std::max(2, http_threads));
  s->server_->new_task_queue = [n] { return new httplib::ThreadPool(n); };
  s->server_->set_read_timeout(30, 0);
  s->server_->set_write_timeout(30, 0);
  s->Routes();
  s->port_ = port == 0 ? s->server_->bind_to_any_port(s->host_)
                       : (s->server_->bind_to_port(s->host_, port) ? port : -1);
  if (s->port_ < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  httplib::Server* srv = s->server_.get();
  s->threads_->listen = std::thread([srv] { srv->listen_after_bind(); });
  while (!srv->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s;
}

OpenAiServer::~OpenAiServer() { Stop(); }

void OpenAiServer::Stop() {
  if (server_) server_->stop();
  if (threads_ && threads_->listen.joinable()) threads_->listen.join();
}

void OpenAiServer::Routes() {
  model::BatchEngine* engine = engine_;
  const ServeIdentity id = identity_;
  Threads* threads = threads_.get();
  const int64_t started = started_;

  auto generate = [engine, id, threads](ApiKind kind, const httplib::Request& req,
                                        httplib::Response& res) {
    ParsedRequest pr;
    ApiError err;
    if (!ParseRequest(kind, req.body, engine->model(), id, &pr, &err)) return SendError(res, err);
    auto pending = std::make_shared<Pending>();
    auto callback = [pending](const model::SessionEvent& e) {
      {
        std::lock_guard<std::mutex> lock(pending->mu);
        pending->events.push_back(e);
        if (e.done) pending->done = true;
      }
      pending->cv.notify_all();
      return !pending->gone.load();
    };
    StatusOr<uint64_t> sid = engine->Submit(std::move(pr.session), callback);
    if (!sid.ok()) return SendError(res, EngineError(sid.status()));
    pending->id = *sid;
    // Wait for the prompt's first result, so that an admission error is a proper status.
    std::deque<model::SessionEvent> first;
    while (first.empty()) first = pending->Take(std::chrono::milliseconds(1000));
    if (first.front().done && first.front().finish == model::FinishReason::kError)
      return SendError(res, EngineError(first.front().error));
    const std::string rid = absl::StrCat(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-polykv-",
                                         threads->next_request.fetch_add(1));
    const int64_t created = UnixNow();
    const std::string model_name = pr.model.empty() ? id.model_alias : pr.model;
    auto release = [pending, engine](bool) {
      if (!pending->done) {
        pending->gone = true;
        engine->Cancel(pending->id);
      }
    };
    struct StreamState {
      std::deque<model::SessionEvent> queued;
      std::string text;          // whole responses: the answer so far
      std::vector<int32_t> ids;  // whole responses: the answer's ids
      bool first = true;
      std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
    };
    auto st = std::make_shared<StreamState>();
    st->queued = std::move(first);
    const bool stream = pr.stream, usage = pr.include_usage, want_ids = pr.return_token_ids;
    auto provider = [=](size_t, httplib::DataSink& sink) -> bool {
      std::deque<model::SessionEvent> got;
      got.swap(st->queued);
      if (got.empty()) got = pending->Take(std::chrono::milliseconds(1000));
      // A whole response writes nothing until the end: a space (leading JSON whitespace) once a
      // second notices a client that went away.
      const auto now = std::chrono::steady_clock::now();
      const bool done = !got.empty() && got.back().done;
      if (!stream && !done && now - st->last_write >= std::chrono::seconds(1)) {
        st->last_write = now;
        if (!sink.write(" ", 1)) return false;
      }
      for (const model::SessionEvent& e : got) {
        if (stream && (!e.text_delta.empty() || st->first || (want_ids && !e.new_ids.empty()))) {
          json chunk = ChunkJson(kind, rid, created, model_name, e.text_delta, st->first, "");
          if (want_ids) chunk["choices"][0]["token_ids"] = e.new_ids;
          const std::string c = Sse(chunk);
          st->first = false;
          if (!sink.write(c.data(), c.size())) return false;
        }
        st->text += e.text_delta;
        st->ids.insert(st->ids.end(), e.new_ids.begin(), e.new_ids.end());
        if (!e.done) continue;
        std::string out;
        const json u = UsageJson(e.cached_tokens, e.prompt_tokens, e.completion_tokens);
        if (e.finish == model::FinishReason::kError) {
          out = stream ? Sse(ErrorJson(EngineError(e.error)))
                       : ErrorJson(EngineError(e.error)).dump();
        } else if (stream) {
          out =
              Sse(ChunkJson(kind, rid, created, model_name, "", false, FinishReasonWord(e.finish)));
          if (usage) {
            json uc = ChunkJson(kind, rid, created, model_name, "", false, "");
            uc["choices"] = json::array();
            uc["usage"] = u;
            out += Sse(uc);
          }
        } else {
          json whole = ResponseJson(kind, rid, created, model_name, st->text, e.finish, u);
          if (want_ids) whole["choices"][0]["token_ids"] = st->ids;
          out = whole.dump();
        }
        if (stream) out += "data: [DONE]\n\n";
        if (!sink.write(out.data(), out.size())) return false;
        sink.done();
        return true;
      }
      return true;
    };
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(stream ? "text/event-stream" : "application/json", provider,
                                     release);
  };
  server_->Post("/v1/completions", [generate](const httplib::Request& q, httplib::Response& r) {
    generate(ApiKind::kCompletion, q, r);
  });
  server_->Post("/v1/chat/completions",
                [generate](const httplib::Request& q, httplib::Response& r) {
                  generate(ApiKind::kChat, q, r);
                });
  server_->Get("/v1/models", [id, started](const httplib::Request&, httplib::Response& res) {
    const json m = {{"id", id.model_alias},
                    {"object", "model"},
                    {"created", started},
                    {"owned_by", "polykv"},
                    {"pool", id.pool_id}};
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(),
                    "application/json");
  });
  server_->Get("/health", [engine, id](const httplib::Request&, httplib::Response& res) {
    const model::BatchEngineStats s = engine->stats();
    res.set_content(json{{"status", "ok"},
                         {"model", id.model_alias},
                         {"pool", id.pool_id},
                         {"cached_tokens", engine->prefix_tokens()},
                         {"running", s.running},
                         {"waiting", s.waiting}}
                        .dump(),
                    "application/json");
  });
  server_->Get("/metrics", [engine](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(*engine), "text/plain; version=0.0.4");
  });
  server_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.http_status = res.status;
    e.message = absl::StrCat(req.method, " ", req.path, ": ",
                             res.status == 404 ? "no such route" : "request failed");
    e.code = res.status == 404 ? "not_found" : "";
    SendError(res, e);
  });
}

}  // namespace polykv::cli::serve

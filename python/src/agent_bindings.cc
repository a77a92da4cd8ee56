// _polykv agents: PooledAgent behind a mutex (one Run at a time per agent), generate with
// stop strings, a streaming iterator fed from a worker thread through SamplingOptions::on_token
// (cancellation = the callback returns false), scoring, chat rendering with the model's own
// template. The GIL is released while a model computes, so agents in several Python threads
// run side by side.
#include <pybind11/stl.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings.h"
#include "polykv/agent.h"
#include "text_stream.h"

namespace py = pybind11;

namespace polykv::python {
namespace {

namespace pc = polykv::client;

/// Sampling settings as Python passes them (temperature <= 0: greedy).
struct GenArgs {
  int32_t max_new_tokens = 64;
  float temperature = 0;
  float top_p = 0.95f;
  uint64_t seed = 0;
  bool stop_at_eos = true;
  std::vector<std::string> stop;

  model::SamplingOptions Sampling() const {
    model::SamplingOptions s;
    s.max_new_tokens = max_new_tokens;
    s.greedy = temperature <= 0;
    s.temperature = temperature > 0 ? temperature : 1.0f;
    s.top_p = top_p;
    s.seed = seed;
    s.stop_at_eos = stop_at_eos;
    return s;
  }
};

/// The agent and the lock that keeps its Runs one at a time (streams hold it from a worker).
struct AgentCore {
  std::unique_ptr<pc::PooledAgent> agent;
  std::string pool;
  std::string device;  ///< "cpu" or "cuda:N"
  std::mutex mu;

  TextStream NewTextStream(const std::vector<std::string>& stop) {
    pc::PooledAgent* a = agent.get();
    return TextStream([a](const std::vector<int32_t>& ids) { return a->DecodeText(ids); }, stop);
  }
};

py::dict StatsDict(const pc::AgentStats& s) {
#define F(m) POLYKV_PY_FIELD(pc::AgentStats, m)
  return FieldDict(s, F(attach_ms), F(decode_ms), F(prompt_first_token_ms), F(ttft_ms),
                   F(generation_ms), F(tokens_per_s), F(document_tokens), F(prompt_tokens),
                   F(new_tokens), F(pool_bytes), F(private_kv_bytes));
#undef F
}

/// The result dict of a generation: token_ids, text (bytes), finish_reason, codec, stats.
py::dict ResultDict(const pc::AgentResult& r, const std::string& text, bool stopped, bool cancelled,
                    int32_t max_new_tokens) {
  py::dict d;
  d["token_ids"] = r.answer_ids;
  d["text"] = py::bytes(text);
  const char* reason = "eos";
  if (stopped) {
    reason = "stop";
  } else if (cancelled) {
    reason = "cancelled";
  } else if (static_cast<int32_t>(r.answer_ids.size()) >= max_new_tokens) {
    reason = "length";
  }
  d["finish_reason"] = reason;
  d["prompt_ids"] = r.prompt_ids;
  d["codec"] = r.codec;
  d["attend"] = pc::AttendName(r.attend);
  d["stats"] = StatsDict(r.stats);
  return d;
}

/// A generation running on a worker thread; the Python iterator pulls (token, text) events.
class PyStream {
 public:
  PyStream(std::shared_ptr<AgentCore> core, std::vector<int32_t> prompt, GenArgs args)
      : core_(std::move(core)), args_(std::move(args)) {
    worker_ = std::thread([this, prompt = std::move(prompt)] { Work(prompt); });
  }
  ~PyStream() {
    cancel_ = true;
    if (worker_.joinable()) worker_.join();
  }

  /// The next event (token id, final text bytes); token -1 carries only text (the end).
  /// Raises StopIteration at the end, or the generation's error.
  py::tuple Next() {
    std::pair<int32_t, std::string> ev;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return !events_.empty() || done_; });
      if (events_.empty()) {
        l.unlock();
        if (!status_.ok()) {
          const Status s = status_;
          status_ = absl::OkStatus();  // raised once
          py::gil_scoped_acquire gil;
          Check(s);
        }
        py::gil_scoped_acquire gil;
        throw py::stop_iteration();
      }
      ev = std::move(events_.front());
      events_.pop_front();
    }
    return py::make_tuple(ev.first, py::bytes(ev.second));
  }
  void Cancel() { cancel_ = true; }
  /// The result dict once the iterator ended (None before).
  py::object Result() {
    std::lock_guard<std::mutex> l(mu_);
    if (!done_ || !result_) return py::none();
    return ResultDict(*result_, text_, stopped_, cancelled_, args_.max_new_tokens);
  }

 private:
  void Work(const std::vector<int32_t>& prompt) {
    std::lock_guard<std::mutex> run(core_->mu);
    TextStream ts = core_->NewTextStream(args_.stop);
    model::SamplingOptions s = args_.Sampling();
    s.on_token = [this, &ts](int32_t tok) {
      std::string piece = ts.Push(tok);
      {
        std::lock_guard<std::mutex> l(mu_);
        events_.emplace_back(tok, std::move(piece));
      }
      cv_.notify_one();
      return !cancel_.load() && !ts.stopped();
    };
    StatusOr<pc::AgentResult> r = core_->agent->Run(core_->pool, prompt, s);
    std::string tail = r.ok() ? ts.Finish() : "";
    std::lock_guard<std::mutex> l(mu_);
    if (!tail.empty()) events_.emplace_back(-1, std::move(tail));
    if (r.ok()) {
      result_ = std::move(r).value();
    } else {
      status_ = r.status();
    }
    text_ = ts.text();
    stopped_ = ts.stopped();
    cancelled_ = cancel_.load() && !stopped_;
    done_ = true;
    cv_.notify_all();
  }

  std::shared_ptr<AgentCore> core_;
  GenArgs args_;
  std::thread worker_;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int32_t, std::string>> events_;
  bool done_ = false;
  Status status_;
  std::optional<pc::AgentResult> result_;
  std::string text_;
  bool stopped_ = false, cancelled_ = false;
};

/// An agent of one pool.
class PyAgent {
 public:
  PyAgent(const std::string& endpoint, const std::string& model, const std::string& pool,
          int threads, const std::string& attend, int timeout_ms, const std::string& device,
          bool allow_copy)
      : core_(std::make_shared<AgentCore>()) {
    pc::AgentOptions o;
    o.model_path = model;
    o.endpoint = endpoint;
    o.threads = threads;
    o.timeout_ms = timeout_ms;
    StatusOr<pc::Attend> a = pc::ParseAttend(attend);
    Check(a.status());
    o.attend = *a;
    StatusOr<pc::AgentDevice> d = pc::ParseAgentDevice(device);
    Check(d.status());
    o.device = *d;
    o.allow_copy = allow_copy;
    core_->agent = WithoutGil([&] { return pc::PooledAgent::Create(o); });
    core_->pool = pool;
    core_->device = pc::AgentDeviceName(*d);
  }

  const std::string& pool() const { return core_->pool; }
  const std::string& device() const { return core_->device; }

  std::vector<int32_t> Encode(const std::string& text) const {
    StatusOr<std::vector<int32_t>> r = core_->agent->EncodePrompt(text);
    Check(r.status());
    return std::move(r).value();
  }
  py::bytes Decode(const std::vector<int32_t>& ids) const {
    return py::bytes(core_->agent->DecodeText(ids));
  }
  std::string RenderChat(const std::vector<std::pair<std::string, std::string>>& messages) const {
    std::vector<model::ChatMessage> msgs;
    for (const auto& [role, content] : messages) msgs.push_back({role, content});
    StatusOr<std::string> r = pc::ChatTurnsAfterDocument(core_->agent->model().tokenizer(), msgs);
    Check(r.status());
    return std::move(r).value();
  }
  std::string ChatDocument(const std::string& document, const std::string& instruction) const {
    StatusOr<std::string> r =
        pc::ChatDocumentFor(core_->agent->model().tokenizer(), document, instruction);
    Check(r.status());
    return std::move(r).value();
  }

  py::dict Generate(const std::vector<int32_t>& prompt, const GenArgs& args) {
    model::SamplingOptions s = args.Sampling();
    std::optional<TextStream> ts;
    if (!args.stop.empty()) {
      ts.emplace(core_->NewTextStream(args.stop));
      s.on_token = [&ts](int32_t tok) {
        ts->Push(tok);
        return !ts->stopped();
      };
    }
    std::optional<StatusOr<pc::AgentResult>> r;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> run(core_->mu);
      r.emplace(core_->agent->Run(core_->pool, prompt, s));
      if (ts && r->ok()) ts->Finish();
    }
    Check(r->status());
    const pc::AgentResult& res = r->value();
    return ResultDict(res, ts ? ts->text() : res.answer_text, ts && ts->stopped(), false,
                      args.max_new_tokens);
  }

  std::shared_ptr<PyStream> Stream(std::vector<int32_t> prompt, GenArgs args) {
    return std::make_shared<PyStream>(core_, std::move(prompt), std::move(args));
  }

  std::vector<double> Score(const std::vector<int32_t>& input, const std::vector<int32_t>& targets,
                            int64_t rows) {
    std::vector<double> out = WithoutGil([&] {
      std::lock_guard<std::mutex> run(core_->mu);
      return core_->agent->Score(core_->pool, input, targets, rows);
    });
    for (double& x : out) x = -x;  // -log p -> log p
    return out;
  }

  std::vector<int32_t> PoolTokenIds() {
    return WithoutGil([&] {
      std::lock_guard<std::mutex> run(core_->mu);
      return core_->agent->PoolTokenIds(core_->pool);
    });
  }

 private:
  std::shared_ptr<AgentCore> core_;
};

}  // namespace

void RegisterAgent(py::module_& m) {
  m.def(
      "chat_document",
      [](const std::string& model, const std::string& document, const std::string& instruction) {
        const std::unique_ptr<model::Tokenizer> tok =
            WithoutGil([&] { return model::LoadTokenizer(model); });
        StatusOr<std::string> r = pc::ChatDocumentFor(tok.get(), document, instruction);
        Check(r.status());
        return std::move(r).value();
      },
      "The document framed as a system turn with the model's own chat template.");
  py::class_<GenArgs>(m, "GenArgs")
      .def(py::init<>())
      .def_readwrite("max_new_tokens", &GenArgs::max_new_tokens)
      .def_readwrite("temperature", &GenArgs::temperature)
      .def_readwrite("top_p", &GenArgs::top_p)
      .def_readwrite("seed", &GenArgs::seed)
      .def_readwrite("stop_at_eos", &GenArgs::stop_at_eos)
      .def_readwrite("stop", &GenArgs::stop);

  py::class_<PyStream, std::shared_ptr<PyStream>>(m, "Stream")
      .def("__iter__", [](std::shared_ptr<PyStream> s) { return s; })
      .def("__next__", &PyStream::Next)
      .def("cancel", &PyStream::Cancel)
      .def("result", &PyStream::Result);

  py::class_<PyAgent>(m, "Agent")
      .def(py::init<const std::string&, const std::string&, const std::string&, int,
                    const std::string&, int, const std::string&, bool>(),
           py::arg("endpoint"), py::arg("model"), py::arg("pool"), py::arg("threads"),
           py::arg("attend"), py::arg("timeout_ms"), py::arg("device"), py::arg("allow_copy"))
      .def_property_readonly("pool", &PyAgent::pool)
      .def_property_readonly("device", &PyAgent::device)
      .def("encode", &PyAgent::Encode)
      .def("decode", &PyAgent::Decode)
      .def("render_chat", &PyAgent::RenderChat)
      .def("chat_document", &PyAgent::ChatDocument)
      .def("generate", &PyAgent::Generate)
      .def("stream", &PyAgent::Stream)
      .def("score", &PyAgent::Score)
      .def("pool_token_ids", &PyAgent::PoolTokenIds);
}

}  // namespace polykv::python

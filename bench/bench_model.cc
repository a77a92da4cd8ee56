// bench_model: the mapped runtime (kernels over the file's own blocks) next to
// the libtorch f32 copy runtime (the baseline), on the same model in one run:
// prefill tokens/s at 512 and 2,048 tokens and decode tokens/s after a
// 512-token prompt, at 1 and 2 threads; the weight bytes read per decoded token
// and the effective bandwidth next to single-thread memcpy measured in the same
// run; memory after load (RSS, PSS, private) of each runtime. Usage:
// bench_model [--model PATH] (default: env POLYKV_SMOLLM2_GGUF)
// [--decode-tokens N]
//                    [--text FILE] [--threads N] [--skip-copy] [--decode-only]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "polykv/kernels/cpu.h"
#include "polykv/model/llama.h"
#ifdef POLYKV_HAVE_TORCH
#include "polykv/model/torch_reference.h"
#endif

namespace {

using polykv::model::KvCache;
using polykv::model::LlamaModel;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A field of /proc/self/smaps_rollup in MiB (e.g. "Rss:", "Pss:",
// "Private_Dirty:").
double RollupMiB(const char *key) {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::strlen(key)) / 1024.0;
  return 0;
}

// Private = Private_Clean + Private_Dirty: pages only this process maps (file
// pages of a model no other process maps count here too); Anonymous = memory
// not backed by a file.
struct Memory {
  double rss = 0, pss = 0, priv = 0, anon = 0;
};
Memory ReadMemory() {
  Memory m;
  m.rss = RollupMiB("Rss:");
  m.pss = RollupMiB("Pss:");
  m.priv = RollupMiB("Private_Clean:") + RollupMiB("Private_Dirty:");
  m.anon = RollupMiB("Anonymous:");
  return m;
}

// Single-thread memcpy bandwidth (GB/s) over `bytes`, best of 5 after a
// warm-up.
double MemcpyGbps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int r = 0; r < 6; ++r) {
    const double t = Now();
    std::memcpy(b.data(), a.data(), bytes);
    const double dt = Now() - t;
    if (r > 0) best = std::min(best, dt);
  }
  volatile char sink = b[bytes / 2];
  (void)sink;
  return static_cast<double>(bytes) / best / 1e9;
}

struct Figures {
  double prefill512 = 0, prefill2048 = 0, decode = 0;
};

Figures Run(LlamaModel &m, const std::vector<int32_t> &doc, int threads, int decode_tokens,
            bool decode_only) {
  polykv::model::SetComputeThreads(threads);
  Figures f;
  for (int64_t n : {512, 2048}) {
    if (decode_only) break;
    const double s = Now();
    auto r = m.Prefill(absl::MakeConstSpan(doc.data(), n), 512);
    const double dt = Now() - s;
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(r.status().message()).c_str());
      std::exit(1);
    }
    (n == 512 ? f.prefill512 : f.prefill2048) = n / dt;
  }
  KvCache cache = m.NewCache(512 + decode_tokens + 1);
  if (!m.Forward(absl::MakeConstSpan(doc.data(), 512), cache).ok()) std::exit(1);
  polykv::model::SamplingOptions so;
  so.max_new_tokens = decode_tokens;
  so.stop_at_eos = false;
  const int32_t next[1] = {doc[512]};
  auto g = m.Generate(cache, absl::MakeConstSpan(next, 1), so);
  if (!g.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(g.status().message()).c_str());
    std::exit(1);
  }
  // After the first token each returned token costs one decode step.
  const double decode_ms = g->total_ms - g->first_token_ms;
  f.decode = (g->tokens.size() - 1) * 1000.0 / decode_ms;
  return f;
}

// The command line.
struct Options {
  std::string model_path;
  int decode_tokens = 128;
  int max_threads = 2;
  bool skip_copy = false;
  bool crossover = false;
  bool prompt_rows = false;
  bool decode_only = false;
  std::string text_path = "data/wikitext-2/wiki.test.raw";
};

// Parses the flags into *o: -1 to go on, else main's exit code (--help, a bad
// flag).
int ParseOptions(int argc, char **argv, Options *o) {
  CLI::App app{"bench_model: mapped-kernel runtime vs the libtorch f32 copy runtime"};
  o->model_path = std::getenv("POLYKV_SMOLLM2_GGUF") ? std::getenv("POLYKV_SMOLLM2_GGUF") : "";
  app.add_option("--model", o->model_path,
                 "Model (.gguf or HF folder); default $POLYKV_SMOLLM2_GGUF");
  app.add_option("--decode-tokens", o->decode_tokens, "Tokens to decode after a 512-token prompt");
  app.add_option("--threads", o->max_threads, "Second thread count measured (the first is 1)");
  app.add_flag("--skip-copy", o->skip_copy, "Measure only the mapped runtime");
  app.add_flag("--decode-only", o->decode_only,
               "Measure only decode after a 512-token prompt (prefill figures "
               "print as 0)");
  app.add_flag("--crossover", o->crossover,
               "Only time forwards of 4..128 rows on the quantized kernels vs "
               "dequantized "
               "tiles + GEMM, then exit");
  app.add_flag("--prompt-rows", o->prompt_rows,
               "Only time an agent's prompt forward (1, 4, 16, 32 rows) after "
               "a 1451-token "
               "document held as a raw f32 prefix, 1 thread, then exit");
  app.add_option("--text", o->text_path,
                 "Document text to tokenize (default: WikiText-2 test, relative to the "
                 "repository root)");
  CLI11_PARSE(app, argc, argv);
  if (o->model_path.empty()) {
    std::fprintf(stderr, "error: no model: pass --model or set POLYKV_SMOLLM2_GGUF\n");
    return 1;
  }
  return -1;
}

// Document tokens: WikiText-2 through the model's tokenizer, else a fixed id
// pattern; 2,049.
std::vector<int32_t> DocumentTokens(const LlamaModel &mm, const std::string &text_path) {
  std::vector<int32_t> doc;
  if (mm.tokenizer() != nullptr) {
    std::ifstream in(text_path, std::ios::binary);
    std::string text(40000, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    auto ids = mm.tokenizer()->Encode(text, false);
    if (ids.ok()) doc = *ids;
  }
  for (int64_t i = static_cast<int64_t>(doc.size()); i < 2049; ++i)
    doc.push_back(static_cast<int32_t>((i * 7919 + 13) % mm.config().vocab));
  doc.resize(2049);
  return doc;
}

// --crossover: prefill 512 tokens in chunks of n rows, once with every product
// on the quantized kernels and once on dequantized tiles + GEMM (1 thread).
// main's exit code.
int RunCrossover(const std::string &model_path, const polykv::model::LoadOptions &mapped_opts,
                 const std::vector<int32_t> &doc) {
  polykv::model::SetComputeThreads(1);
  std::unique_ptr<LlamaModel> variant[2];
  for (int k = 0; k < 2; ++k) {
    polykv::model::LoadOptions o = mapped_opts;
    o.quantized_rows = k == 0 ? (int64_t{1} << 30) : 0;
    auto m = LlamaModel::Load(model_path, o);
    if (!m.ok()) return 1;
    variant[k] = std::move(*m);
  }
  std::printf("%-10s %16s %16s\n", "rows", "kernels tok/s", "GEMM tok/s");
  for (int64_t n : {4, 8, 16, 32, 48, 64, 96, 128, 256, 512}) {
    double tps[2];
    for (int k = 0; k < 2; ++k) {
      const double s = Now();
      auto r = variant[k]->Prefill(absl::MakeConstSpan(doc.data(), 512), n);
      if (!r.ok()) return 1;
      tps[k] = 512 / (Now() - s);
    }
    std::printf("%-10lld %16.1f %16.1f\n", static_cast<long long>(n), tps[0], tps[1]);
  }
  return 0;
}

// --prompt-rows: an agent's prompt forward of 1..32 rows after a 1451-token
// document held as a raw f32 prefix, 1 thread, median of 9. main's exit code.
int RunPromptRows(LlamaModel &mm, const std::vector<int32_t> &doc) {
  polykv::model::SetComputeThreads(1);
  const int64_t P = 1451;
  polykv::model::KvCache cache = mm.NewCache(P);
  if (!mm.Forward(absl::MakeConstSpan(doc.data(), P), cache).ok()) return 1;
  auto frozen = mm.FreezeAsPrefix(std::move(cache), 64);
  if (!frozen.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(frozen.status().message()).c_str());
    return 1;
  }
  std::printf(
      "prompt forward after a %lld-token document (raw f32 prefix), 1 "
      "thread, median of 9\n",
      static_cast<long long>(P));
  std::printf("%-6s %12s %16s\n", "rows", "ms", "ms per row");
  for (int64_t n : {1, 4, 16, 32}) {
    std::vector<double> t;
    for (int r = 0; r < 10; ++r) {
      frozen->length = P;
      frozen->tokens.resize(static_cast<size_t>(P));
      const double s = Now();
      if (!mm.Forward(absl::MakeConstSpan(doc.data() + P, n), *frozen).ok()) return 1;
      if (r > 0) t.push_back(Now() - s);
    }
    std::sort(t.begin(), t.end());
    const double ms = t[t.size() / 2] * 1e3;
    std::printf("%-6lld %12.1f %16.2f\n", static_cast<long long>(n), ms, ms / n);
  }
  return 0;
}

// What each runtime measured: speeds at 1 and max_threads threads, load time,
// weight bytes per token, memory after load (less the base).
struct RuntimeFigures {
  Figures one, many;
  double load_s = 0, bytes_per_token = 0;
  Memory after_load;
};

// The libtorch f32 copy runtime, measured alone (after the mapped model is
// released). main's exit code on failure, else -1.
int MeasureCopy(const Options &o, const std::vector<int32_t> &doc, const Memory &base,
                RuntimeFigures *out) {
  polykv::model::LoadOptions copy_opts;
  copy_opts.threads = 1;
  copy_opts.weights = polykv::model::WeightStorage::kCopy;
  const Memory before_copy = ReadMemory();
  const double t0 = Now();
#ifdef POLYKV_HAVE_TORCH
  auto copy = polykv::model::LoadTorchReference(o.model_path, copy_opts);
#else
  polykv::StatusOr<std::unique_ptr<LlamaModel> > copy = absl::UnimplementedError(
      "built without libtorch (POLYKV_WITH_TORCH=OFF): no f32 reference "
      "runtime");
#endif
  out->load_s = Now() - t0;
  if (!copy.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(copy.status().message()).c_str());
    return 1;
  }
  Memory &after_copy = out->after_load;
  after_copy = ReadMemory();
  after_copy.rss -= before_copy.rss - base.rss;
  after_copy.pss -= before_copy.pss - base.pss;
  after_copy.priv -= before_copy.priv - base.priv;
  after_copy.anon -= before_copy.anon - base.anon;
  out->bytes_per_token = static_cast<double>((*copy)->WeightBytesPerToken());
  out->one = Run(**copy, doc, 1, o.decode_tokens, o.decode_only);
  out->many = Run(**copy, doc, o.max_threads, o.decode_tokens, o.decode_only);
  return -1;
}

// The model and kernel lines, the figure table (f32 copy vs mapped) and the
// bandwidth lines.
void PrintTable(const Options &o, const polykv::model::ModelConfig &c, const Memory &base,
                const RuntimeFigures &mapped, const RuntimeFigures &copy,
                const Memory &after_mapped_run, double memcpy_gbps) {
  std::printf("model: %s\n  %d layers, hidden %d, heads %d/%d kv, ffn %d, vocab %d\n",
              o.model_path.c_str(), c.layers, c.hidden, c.heads, c.kv_heads, c.ffn, c.vocab);
  std::printf("kernels: %s (CPU variants:", polykv::kernels::IsaName(polykv::kernels::BestIsa()));
  for (auto i : polykv::kernels::SupportedIsas()) std::printf(" %s", polykv::kernels::IsaName(i));
  std::printf(")\n\n");
  std::printf("%-40s %-10s %12s %12s %8s\n", "figure", "unit", "f32 copy", "mapped", "ratio");
  const auto row = [&](const char *name, const char *unit, double base_v, double v) {
    if (o.skip_copy) {
      std::printf("%-40s %-10s %12s %12.1f %8s\n", name, unit, "-", v, "");
    } else {
      std::printf("%-40s %-10s %12.1f %12.1f %7.2fx\n", name, unit, base_v, v, v / base_v);
    }
  };
  char name[96];
  for (int t : {1, o.max_threads}) {
    const Figures &fm = t == 1 ? mapped.one : mapped.many;
    const Figures &fc = t == 1 ? copy.one : copy.many;
    std::snprintf(name, sizeof name, "prefill 512 tokens, %d thread(s)", t);
    row(name, "tokens/s", fc.prefill512, fm.prefill512);
    std::snprintf(name, sizeof name, "prefill 2048 tokens, %d thread(s)", t);
    row(name, "tokens/s", fc.prefill2048, fm.prefill2048);
    std::snprintf(name, sizeof name, "decode after 512, %d thread(s)", t);
    row(name, "tokens/s", fc.decode, fm.decode);
  }
  const double bytes_per_token = mapped.bytes_per_token;
  row("weight bytes read per token", "MiB", copy.bytes_per_token / 1048576.0,
      bytes_per_token / 1048576.0);
  row("load time", "s", copy.load_s, mapped.load_s);
  const Memory &ac = copy.after_load;
  const Memory &am = mapped.after_load;
  row("RSS after load", "MiB", ac.rss - base.rss, am.rss - base.rss);
  row("PSS after load", "MiB", ac.pss - base.pss, am.pss - base.pss);
  row("private after load", "MiB", ac.priv - base.priv, am.priv - base.priv);
  row("anonymous after load", "MiB", ac.anon - base.anon, am.anon - base.anon);
  std::printf("%-40s %-10s %12s %12.1f\n", "RSS after the mapped runs", "MiB", "",
              after_mapped_run.rss - base.rss);
  std::printf("%-40s %-10s %12s %12.1f\n", "anonymous after the mapped runs", "MiB", "",
              after_mapped_run.anon - base.anon);
  std::printf("\nsingle-thread memcpy (%.0f MiB buffers): %.2f GB/s\n", bytes_per_token / 1048576.0,
              memcpy_gbps);
  for (int t : {1, o.max_threads}) {
    const Figures &fm = t == 1 ? mapped.one : mapped.many;
    const double bw = bytes_per_token * fm.decode / 1e9;
    std::printf(
        "mapped decode, %d thread(s): %.1f tok/s x %.1f MiB = %.2f "
        "GB/s effective = %.0f%% "
        "of single-thread memcpy\n",
        t, fm.decode, bytes_per_token / 1048576.0, bw, 100.0 * bw / memcpy_gbps);
  }
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (int rc = ParseOptions(argc, argv, &o); rc >= 0) return rc;

  const Memory base = ReadMemory();
  polykv::model::LoadOptions mapped_opts;
  mapped_opts.threads = 1;
  mapped_opts.weights = polykv::model::WeightStorage::kMapped;
  RuntimeFigures mapped_f;
  const double t0 = Now();
  auto mapped = LlamaModel::Load(o.model_path, mapped_opts);
  mapped_f.load_s = Now() - t0;
  if (!mapped.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(mapped.status().message()).c_str());
    return 1;
  }
  mapped_f.after_load = ReadMemory();
  LlamaModel &mm = **mapped;
  const std::vector<int32_t> doc = DocumentTokens(mm, o.text_path);

  mapped_f.bytes_per_token = static_cast<double>(mm.WeightBytesPerToken());
  const double memcpy_gbps = MemcpyGbps(static_cast<size_t>(mapped_f.bytes_per_token));
  if (o.crossover) return RunCrossover(o.model_path, mapped_opts, doc);
  const polykv::model::ModelConfig c = mm.config();  // mm is released before the copy runs
  if (o.prompt_rows) return RunPromptRows(mm, doc);
  mapped_f.one = Run(mm, doc, 1, o.decode_tokens, o.decode_only);
  mapped_f.many = Run(mm, doc, o.max_threads, o.decode_tokens, o.decode_only);
  const Memory after_mapped_run = ReadMemory();

  RuntimeFigures copy_f;
  if (!o.skip_copy) {
    mapped->reset();  // measure the copy runtime alone
    if (int rc = MeasureCopy(o, doc, base, &copy_f); rc >= 0) return rc;
  }
  PrintTable(o, c, base, mapped_f, copy_f, after_mapped_run, memcpy_gbps);
  return 0;
}

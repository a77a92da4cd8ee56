// polykv-cli eval, agents section: the paper's agent-count invariance. The same windows are
// scored by N = 1, 3, 10, 15 agent processes at once, each attached to ONE pool of the
// window's compressed context in a real polykvd (`polykv-cli agent --score-ids`): a
// codec-none pool gives the full-precision reference (bit-exact with an own prefill), each
// codec's pool the change, with a paired 95% interval over windows.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "eval/codec_spec.h"
#include "eval/stats.h"
#include "polykv/status.h"

namespace polykv::eval {

/// How AgentInvariance runs.
struct AgentEvalOptions {
  std::string model_path;  ///< the agents' and the pools' model
  std::string cli;         ///< polykv-cli binary that runs the agents
  std::string daemon;      ///< polykvd binary ("" = next to `cli`: ../daemon, ../sbin, .)
  std::string endpoint;    ///< a running polykvd; "" = start one for the run
  std::string work_dir;    ///< children's stdout/stderr and the daemon's socket
  std::vector<int> counts = {1, 3, 10, 15};  ///< agents alive at once per run
  int windows = 2;
  int64_t context = 2048;  ///< L (window of L + 1 tokens, as PplVsContext)
  double score_fraction = 0.5;
  int64_t offset = 0;
  std::function<void(const std::string&)> log;
};

/// One codec at one agent count.
struct AgentRow {
  std::string codec, spec;
  int agents = 0;
  int windows = 0;
  double nll_full = 0;   ///< mean NLL per token, codec-none pool, 1 agent (over windows)
  double nll_codec = 0;  ///< mean over windows of the agents' mean NLL
  PercentChange change;  ///< paired over windows, as a PPL change in percent
  /// Largest difference between two agents' mean NLL on one window (0: every agent of the
  /// run computed the same numbers).
  double agent_spread = 0;
};

/// Runs the section for every codec (codec "none" is added as the reference when absent).
/// Errors: kInvalidArgument (too few tokens, counts < 1), kUnavailable (no daemon), and the
/// first agent's error.
[[nodiscard]] StatusOr<std::vector<AgentRow>> AgentInvariance(const std::vector<int32_t>& ids,
                                                              const std::vector<CodecSpec>& codecs,
                                                              const AgentEvalOptions& o);

/// "codec,spec,agents,windows,nll_full,nll_codec,ppl_change_pct,ci_lo_pct,ci_hi_pct,agent_spread"
std::string AgentCsv(const std::vector<AgentRow>& rows);
std::string AgentMarkdown(const std::vector<AgentRow>& rows);

}  // namespace polykv::eval

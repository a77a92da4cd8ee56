// Command groups of polykv-cli: one Register function per file (cli/<group>_cmd.cc).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

// ExitCode() and FailWith: how a command fails ("error: <CODE>: <message>", exit code 1).
#include "util/errors.h"

namespace polykv::cli {

/// --endpoint (polykvd's control endpoint; empty: $POLYKV_ENDPOINT or the standard socket) and
/// --timeout-ms (per daemon request, 1..3600000) of a command that talks to polykvd.
inline void AddDaemonOptions(CLI::App* cmd, std::string* endpoint, int* timeout_ms) {
  cmd->add_option("--endpoint", *endpoint,
                  "polykvd control endpoint (default: $POLYKV_ENDPOINT or the standard socket)");
  cmd->add_option("--timeout-ms", *timeout_ms, "per-request timeout in ms (retried)")
      ->check(CLI::Range(1, 3600000));
}

/// --threads: compute threads, 0..1024 (`help` says what 0 means).
inline CLI::Option* AddThreadsOption(CLI::App* cmd, int* threads, const std::string& help) {
  return cmd->add_option("--threads", *threads, help)->check(CLI::Range(0, 1024));
}

/// `codec roundtrip` (codec_cmd.cc).
void RegisterCodecCommands(CLI::App& app);
/// `generate`, `ppl` (model_cmd.cc).
void RegisterModelCommands(CLI::App& app);
/// `tokenize` (tokenize_cmd.cc).
void RegisterTokenizeCommands(CLI::App& app);
/// `ping`, `pools list|show|create|evict` (pools_cmd.cc).
void RegisterPoolsCommands(CLI::App& app);
/// `agent` (agent_cmd.cc).
void RegisterAgentCommands(CLI::App& app);
/// `agents run` (agents_cmd.cc).
void RegisterAgentsCommands(CLI::App& app);
/// `agents serve` under the `agents` group (agents_serve_cmd.cc).
void RegisterAgentsServeCommand(CLI::App& agents);
/// `keys generate` (keys_cmd.cc).
void RegisterKeysCommands(CLI::App& app);
/// `eval` (eval_cmd.cc; library code in cli/eval/).
void RegisterEvalCommands(CLI::App& app);

}  // namespace polykv::cli

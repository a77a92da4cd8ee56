// Command groups of polykv-cli: one Register function per file (cli/<group>_cmd.cc).
#pragma once

#include <CLI/CLI.hpp>

// ExitCode() and FailWith: how a command fails ("error: <CODE>: <message>", exit code 1).
#include "util/errors.h"

namespace polykv::cli {

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

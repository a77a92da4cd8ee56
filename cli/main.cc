// polykv-cli: entry point; each command group registers itself (see commands.h).
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"polykv-cli: inspect and operate PolyKV pools, codecs and models"};
  app.require_subcommand(1);
  polykv::cli::RegisterCodecCommands(app);
  polykv::cli::RegisterModelCommands(app);
  polykv::cli::RegisterTokenizeCommands(app);
  polykv::cli::RegisterPoolsCommands(app);
  polykv::cli::RegisterAgentCommands(app);
  polykv::cli::RegisterAgentsCommands(app);
  polykv::cli::RegisterKeysCommands(app);
  polykv::cli::RegisterEvalCommands(app);
  CLI11_PARSE(app, argc, argv);
  return polykv::cli::ExitCode();
}

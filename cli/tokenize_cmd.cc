// `polykv-cli tokenize`: prints the token ids of a text with a model's tokenizer (a GGUF
// file, even vocabulary-only, a tokenizer.json, a tokenizer.model or a folder with one).
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "polykv/model/tokenizer.h"
#include "util/files.h"

namespace polykv::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string file;
  std::string text;
  bool no_bos = false;
};

Status RunTokenize(const TokenizeOptions& o, bool has_text) {
  if (has_text == !o.file.empty()) {
    return absl::InvalidArgumentError("give exactly one of --file F or TEXT");
  }
  std::string text = o.text;
  if (!o.file.empty()) {
    POLYKV_ASSIGN_OR_RETURN(text, ReadFile(o.file));
  }
  POLYKV_ASSIGN_OR_RETURN(auto tok, polykv::model::LoadTokenizer(o.model));
  POLYKV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(text, /*add_bos=*/!o.no_bos));
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(ids[i]);
  }
  std::cout << line << "\n";
  return absl::OkStatus();
}

}  // namespace

void RegisterTokenizeCommands(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd =
      app.add_subcommand("tokenize", "Print the token ids of a text, space-separated on one line");
  cmd->add_option("--model", opts->model,
                  "GGUF file (vocabulary-only is fine), tokenizer.json, tokenizer.model, or a "
                  "folder holding one")
      ->required();
  cmd->add_option("--file", opts->file, "Read the text from this file");
  CLI::Option* text_opt = cmd->add_option("text", opts->text, "The text to tokenize");
  cmd->add_flag("--no-bos", opts->no_bos, "Do not prepend BOS (even if the model adds one)");
  cmd->callback([opts, text_opt] {
    if (Status s = RunTokenize(*opts, text_opt->count() > 0); !s.ok()) FailWith(s);
  });
}

}  // namespace polykv::cli

// `polykv-cli tokenize`: prints the token ids of a text with a model's tokenizer (a GGUF
// file, even vocabulary-only, a tokenizer.json, a tokenizer.model or a folder with one).
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "commands.h"
#include "polykv/model/tokenizer.h"

namespace polykv::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string file;
  std::string text;
  bool no_bos = false;
};

int RunTokenize(const TokenizeOptions& o, bool has_text) {
  if (has_text == !o.file.empty()) {
    std::cerr << "error: give exactly one of --file F or TEXT\n";
    return 1;
  }
  std::string text = o.text;
  if (!o.file.empty()) {
    std::ifstream f(o.file, std::ios::binary);
    if (!f) {
      std::cerr << "error: cannot read " << o.file << "\n";
      return 1;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  auto tok = polykv::model::LoadTokenizer(o.model);
  if (!tok.ok()) {
    std::cerr << "error: " << tok.status().message() << "\n";
    return 1;
  }
  auto ids = (*tok)->Encode(text, /*add_bos=*/!o.no_bos);
  if (!ids.ok()) {
    std::cerr << "error: " << ids.status().message() << "\n";
    return 1;
  }
  std::string line;
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i) line += ' ';
    line += std::to_string((*ids)[i]);
  }
  std::cout << line << "\n";
  return 0;
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
    if (RunTokenize(*opts, text_opt->count() > 0) != 0) ExitCode() = 1;
  });
}

}  // namespace polykv::cli

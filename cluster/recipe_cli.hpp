#pragma once
// The recipe commands of the troupe CLI: tokenize, detokenize, encode, parse-stream
// (docs/cli.md). They use recipe/recipe.hpp and need no actor runtime.

#include <CLI/CLI.hpp>

#include <string>

namespace troupe::cli {

// The default tokenizer: $TROUPE_TOKENIZER, then <prefix>/share/troupe/tokenizers beside an
// installed binary, then the source tree's recipe/data/deepseek-v4/tokenizer.json.gz.
std::string default_tokenizer();

// Adds the commands to `app`; a command's exit status goes to `rc`.
void add_recipe_commands(CLI::App& app, int& rc);

}  // namespace troupe::cli

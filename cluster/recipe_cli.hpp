#pragma once
// The recipe commands of the troupe CLI: tokenize, detokenize, encode, parse-stream
// (docs/cli.md). They use recipe/recipe.hpp and need no actor runtime.

#include <CLI/CLI.hpp>

namespace troupe::cli {

// Adds the commands to `app`; a command's exit status goes to `rc`.
void add_recipe_commands(CLI::App& app, int& rc);

}  // namespace troupe::cli

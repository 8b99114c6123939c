// troupe: the command-line interface of the troupe serving runtime.
#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{"troupe: an actor-model serving runtime for DeepSeek-V4.1-class MoE models"};
  app.require_subcommand(1);

  auto* version = app.add_subcommand("version", "print the troupe version");
  version->callback([] { std::cout << "troupe " << TROUPE_VERSION << "\n"; });

  CLI11_PARSE(app, argc, argv);
  return 0;
}

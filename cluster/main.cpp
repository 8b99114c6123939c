// troupe: the command-line interface of the troupe serving runtime.
#include "cluster/topology.hpp"

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

namespace {

// `troupe topology check FILE...`: prints "FILE: ok" on stdout for each valid file and every
// problem of each invalid one on stderr. Returns 0 only when every file is valid.
int check_topologies(const std::vector<std::string>& files) {
  int rc = 0;
  for (const auto& file : files) {
    auto result = troupe::cluster::load_topology(file);
    if (result.ok()) {
      std::cout << file << ": ok\n";
      continue;
    }
    rc = 1;
    for (const auto& d : result.errors)
      std::cerr << d.to_string() << "\n";
    std::cerr << file << ": " << result.errors.size()
              << (result.errors.size() == 1 ? " error\n" : " errors\n");
  }
  return rc;
}

// `troupe topology show FILE`: prints the normalized view of a valid file on stdout, or its
// problems on stderr (returning 1).
int show_topology(const std::string& file) {
  auto result = troupe::cluster::load_topology(file);
  if (!result.ok()) {
    for (const auto& d : result.errors)
      std::cerr << d.to_string() << "\n";
    return 1;
  }
  std::cout << troupe::cluster::describe(*result.value);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe: an actor-model serving runtime for DeepSeek-V4.1-class MoE models"};
  app.require_subcommand(1);
  int rc = 0;

  auto* version = app.add_subcommand("version", "print the troupe version");
  version->callback([] { std::cout << "troupe " << TROUPE_VERSION << "\n"; });

  auto* topology = app.add_subcommand("topology", "check and show topology files");
  topology->require_subcommand(1);

  std::vector<std::string> check_files;
  auto* check = topology->add_subcommand(
    "check", "validate topology files; prints FILE: ok or each error as file:line:col");
  check->add_option("FILE", check_files, "topology files (TOML)")->required();
  check->callback([&] { rc = check_topologies(check_files); });

  std::string show_file;
  auto* show = topology->add_subcommand(
    "show", "print the normalized view of a topology: pools, GPUs, storage, autoscaler, nodes");
  show->add_option("FILE", show_file, "a topology file (TOML)")->required();
  show->callback([&] { rc = show_topology(show_file); });

  CLI11_PARSE(app, argc, argv);
  return rc;
}

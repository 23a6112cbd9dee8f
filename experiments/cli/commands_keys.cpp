// `muonbed keys`: the reference of every key an experiment or cluster file may hold (type, range,
// default, meaning, and for strategy options the strategies that read them), printed from the
// tables the parsers use (core/experiment/keys.hpp). docs/KEYS.md is its Markdown output; a ctest
// test (cli.keys_reference) fails when the two differ.
#include <iostream>
#include <string>

#include "core/experiment/keys.hpp"
#include "experiments/cli/commands.hpp"
#include "experiments/cli/format.hpp"

namespace muonbed::cli {

void add_keys_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "keys", "Print every experiment, model, cluster and strategy key: type, range, default");
  static std::string format = "text";
  static std::string section;
  cmd->add_option("--format", format, "text (default) or markdown")
      ->check(CLI::IsMember({"text", "markdown"}));
  cmd->add_option("section", section, "only this group: " + join(key_reference_sections()))
      ->check(CLI::IsMember(key_reference_sections()));
  cmd->footer(R"(Examples:
  muonbed keys strategy                          the strategy options and who reads each
  muonbed keys --format markdown > docs/KEYS.md  regenerate the committed reference)");
  cmd->callback([&exit_code] {
    std::cout << key_reference(format, section);
    exit_code = 0;
  });
}

}  // namespace muonbed::cli

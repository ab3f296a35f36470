// What the commands share: the --config/--set pair, the config they build, and the
// torchtitan-style `--section.key value` spelling.
#include "launch/command.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "data/batches.h"

namespace loom {

void ConfigArgs::add_to(CLI::App* app, const std::string& config_help) {
  app->add_option("--config", path, config_help);
  app->add_option("--set", sets, "override one key: section.key=value (repeatable)");
}

Config config_build(const std::string& path, const std::vector<std::string>& sets, int world, bool lead,
                    bool reads_data) {
  Config cfg = config_defaults();
  if (!path.empty()) config_load_file(cfg, path);
  for (auto& s : sets) config_set(cfg, s);
  if (reads_data) data_source_infer(cfg);
  const int other = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp;
  if (world > 1 && !cfg.set_keys.count("parallel.dp") && other > 0 && world % other == 0) {
    cfg.parallel.dp = world / other;
    if (lead && cfg.parallel.dp > 1)
      spdlog::info("parallel.dp = {}: the {} ranks over tp {}{} x pp {} (set parallel.dp to choose)", cfg.parallel.dp,
                   world, cfg.parallel.tp, cfg.parallel.cp > 1 ? fmt::format(" x cp {}", cfg.parallel.cp) : "",
                   cfg.parallel.pp);
  }
  config_validate(cfg);
  return cfg;
}

std::vector<std::string> args_expand_sections(int argc, char** argv) {
  static const std::vector<std::string> sections = {"model", "train", "data",   "parallel", "checkpoint",
                                                    "fault", "init",  "export", "log"};
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    const std::string& a = out[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      if (a == "--") break;
      continue;
    }
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    const size_t dot = name.find('.');
    if (dot == std::string::npos || std::find(sections.begin(), sections.end(), name.substr(0, dot)) == sections.end())
      continue;
    if (a.find('=') != std::string::npos) {
      out[i] = a.substr(2);
    } else if (i + 1 < out.size() && out[i + 1].rfind("--", 0) != 0) {
      out[i] = name + "=" + out[i + 1];
      out.erase(out.begin() + long(i) + 1);
    } else {
      out[i] = name + "=true";  // a bare flag, as torchtitan's booleans are given
    }
    out.insert(out.begin() + long(i), "--set");
    ++i;
  }
  return out;
}

}  // namespace loom

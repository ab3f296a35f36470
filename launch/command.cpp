// What the commands share: the --config/--set pair, the config they build, and the
// torchtitan-style `--section.key value` spelling.
#include "launch/command.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "data/batches.h"
#include "data/shard_tokenizer.h"
#include "runtime/config_paths.h"

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
  config_paths_check(cfg);  // before a path is opened to look at the data
  if (reads_data) {
    data_source_infer(cfg);
    data_tokenizer_infer(cfg, lead);
  }
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

CLI::Validator whole_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        const size_t sign = !v.empty() && v[0] == '-' ? 1 : 0;
        const bool digits = v.size() > sign && std::all_of(v.begin() + long(sign), v.end(), ::isdigit);
        int64_t n = 0;
        const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
        if (!digits || r.ec != std::errc() || r.ptr != v.data() + v.size() || n < lo || n > hi)
          return fmt::format("takes a whole number from {} to {}, not '{}'", lo, hi, v);
        return "";
      },
      fmt::format("INT in [{} - {}]", lo, hi), "whole_in");
}

CLI::Validator positive_up_to(double hi) {
  return CLI::Validator(
      [hi](std::string& v) -> std::string {
        const bool text = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
          return std::isdigit(uint8_t(c)) || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+';
        });
        double d = NAN;
        const auto r = std::from_chars(v.data(), v.data() + v.size(), d);
        if (!text || r.ec != std::errc() || r.ptr != v.data() + v.size() || !(d > 0 && d <= hi))
          return fmt::format("takes a number above 0 and at most {:g}, not '{}'", hi, v);
        return "";
      },
      fmt::format("NUMBER in (0 - {:g}]", hi), "positive_up_to");
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

// Path-valued config keys hold no control characters (runtime/config_paths.h).
#include "runtime/config_paths.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "runtime/error.h"

namespace loom {

std::string control_char_in(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = uint8_t(s[i]);
    if (c < 0x20 || c == 0x7f) return fmt::format("U+{:04X} at byte {}", c, i);
  }
  return "";
}

void config_paths_check(const Config& cfg) {
  std::vector<std::pair<std::string, const std::string*>> paths = {{"data.path", &cfg.data.path},
                                                                   {"data.val_path", &cfg.data.val_path},
                                                                   {"data.tokenizer_dir", &cfg.data.tokenizer_dir},
                                                                   {"checkpoint.dir", &cfg.checkpoint.dir},
                                                                   {"checkpoint.resume", &cfg.checkpoint.resume},
                                                                   {"init.from", &cfg.init_from},
                                                                   {"export.final", &cfg.export_final},
                                                                   {"log.dir", &cfg.log.dir},
                                                                   {"log.cluster", &cfg.log.cluster}};
  for (size_t i = 0; i < cfg.data.sources.size(); ++i)
    paths.push_back({fmt::format("data.sources entry {}'s path", i + 1), &cfg.data.sources[i].path});
  for (const auto& [key, value] : paths)
    if (const std::string at = control_char_in(*value); !at.empty())
      fail("{} holds a control character ({}); a path cannot: remove it", key, at);
}

}  // namespace loom

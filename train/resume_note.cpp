#include "train/resume_note.h"

#include <fmt/format.h>

#include "checkpoint/manifest.h"
#include "runtime/error.h"

namespace loom {

std::string layout_text(int dp, int tp, int pp, int cp, int ep, int zero, const std::string& dtype, int world) {
  std::string axes;
  for (auto [name, n] : {std::pair{"pp", pp}, {"dp", dp}, {"cp", cp}, {"tp", tp}, {"ep", ep}})
    if (n > 1) axes += fmt::format("{}{} {}", axes.empty() ? "" : " x ", name, n);
  return fmt::format("{}{}, {} ({})", axes.empty() ? "one rank" : axes, zero > 0 ? fmt::format(", ZeRO-{}", zero) : "",
                     dtype, plural(world, "rank"));
}

std::string resume_reshard_note(const std::string& dir, const Config& cfg, int world, const std::string& dtype) {
  nlohmann::json was;
  try {
    was = manifest_read(dir).layout;
  } catch (const Error&) {
    return "";
  }
  if (!was.is_object()) return "";
  auto get = [&](const char* key, int fallback) {
    return was.contains(key) && was[key].is_number_integer() ? was[key].get<int>() : fallback;
  };
  const std::string then = layout_text(
      get("dp", 1), get("tp", 1), get("pp", 1), get("cp", 1), get("ep", 1), get("zero", 0),
      was.contains("dtype") && was["dtype"].is_string() ? was["dtype"].get<std::string>() : dtype, get("world", 1));
  const auto& p = cfg.parallel;
  const std::string now = layout_text(p.dp, p.tp, p.pp, p.cp, p.ep, p.zero, dtype, world);
  return then == now ? "" : fmt::format("; resharded from {} to {}", then, now);
}

}  // namespace loom

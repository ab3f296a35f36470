// What a run was, written into log.dir at its start: the resolved config (config.toml) and
// the facts a reader of its metrics needs later (run.json: the command line, the binary, the
// machine, the layout, the peak MFU divides by). Each run replaces the last run's pair.
#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/file.h"
#include "runtime/launch_env.h"
#include "train/trainer_parts.h"

namespace loom {

void Trainer::Parts::facts_write() const {
  if (!lead || cfg.log.dir.empty()) return;
  std::filesystem::create_directories(cfg.log.dir);
  double load[3] = {0, 0, 0};
  if (::getloadavg(load, 3) < 0) load[0] = load[1] = load[2] = -1;
  const nlohmann::json facts = {
      {"command", opt.command},
      {"started", utc_now_text()},
      {"loom", {{"version", LOOM_VERSION}, {"build", LOOM_BUILD_TYPE}, {"binary_xxh64", binary_digest()}}},
      {"host", {{"name", host_name()}, {"cores", cores_visible()}, {"load_avg", {load[0], load[1], load[2]}}}},
      {"world", mesh->world()},
      {"layout",
       {{"dp", cfg.parallel.dp},
        {"tp", cfg.parallel.tp},
        {"pp", cfg.parallel.pp},
        {"ep", cfg.parallel.ep},
        {"cp", cfg.parallel.cp},
        {"sp", cfg.parallel.sp},
        {"zero", cfg.parallel.zero},
        {"comm", mesh->comm_name()}}},
      {"device", device},
      {"dtype", dtype_name(dtype)},
      {"threads", {{"per_rank", threads}, {"why", threads_why}}},
      {"peak_flops", peak},  // all ranks together: what MFU divides by
      {"start_step", start_step},
      {"resumed_from", resumed_from},
  };
  for (auto [name, text] : {std::pair<const char*, std::string>{"config.toml", config_to_toml(cfg) + "\n"},
                            {"run.json", facts.dump(2) + "\n"}}) {
    const std::string path = cfg.log.dir + "/" + name;
    file_write_atomic(path, [&](std::FILE* f) { file_write(f, text.data(), text.size(), path); });
  }
}

}  // namespace loom

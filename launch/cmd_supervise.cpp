// `loom supervise [options] -- COMMAND...`: runs COMMAND again when it fails for a reason a
// restart cures (launch/supervise.h), optionally elastic over the hosts that answer a probe.
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "launch/command.h"
#include "launch/supervise.h"
#include "runtime/error.h"

namespace loom {

// Parsed by hand: everything after "--" is the command, options and all.
int cmd_supervise_main(int argc, char** argv) {
  SuperviseOptions o;
  std::vector<std::string> command;
  int i = 2;
  auto value = [&](const std::string& flag) -> std::string {
    LOOM_CHECK(i + 1 < argc, "loom supervise: {} needs a value", flag);
    return argv[++i];
  };
  // Decimal digits with at most one point, nothing else (std::stod alone takes "1x", " 1", nan,
  // inf and hexadecimal: "0x10" would be 16).
  auto decimal = [](const std::string& v, bool point) {
    int digits = 0, points = 0;
    for (char c : v) {
      if (c >= '0' && c <= '9')
        ++digits;
      else if (c == '.' && point)
        ++points;
      else
        return false;
    }
    return digits > 0 && points <= 1;
  };
  auto seconds = [&](const std::string& flag) {
    const std::string v = value(flag);
    size_t used = 0;
    double d = -1;
    try {
      if (decimal(v, true)) d = std::stod(v, &used);
    } catch (const std::exception&) {
    }
    LOOM_CHECK(used == v.size() && std::isfinite(d) && d >= 0 && d <= 86400,
               "loom supervise: {} takes seconds from 0 to 86400, not '{}'", flag, v);
    return d;
  };
  auto count = [&](const std::string& flag, const std::string& v, int least) {
    size_t used = 0;
    long long n = -1;
    try {
      if (decimal(v, false)) n = std::stoll(v, &used);
    } catch (const std::exception&) {
    }
    LOOM_CHECK(used == v.size() && n >= least && n <= 1000000,
               "loom supervise: {} takes a whole number from {} to 1000000, not '{}'", flag, least, v);
    return int(n);
  };
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    try {
      if (a == "--max-restarts")
        o.max_restarts = count(a, value(a), 0);
      else if (a == "--backoff-s")
        o.backoff_s = seconds(a);
      else if (a == "--log-dir")
        o.log_dir = value(a);
      else if (a == "--verdict-grace-s")
        o.verdict_grace_s = seconds(a);
      else if (a == "--ranks") {
        const std::string r = value(a);
        const size_t colon = r.find(':');
        LOOM_CHECK(colon != std::string::npos, "--ranks takes MIN:MAX (e.g. 2:4), not '{}'", r);
        o.elastic.min_ranks = count(a, r.substr(0, colon), 1);
        o.elastic.max_ranks = count(a, r.substr(colon + 1), 1);
      } else if (a == "--hosts")
        o.elastic.hosts = hosts_parse(value(a));
      else if (a == "--probe")
        o.elastic.probe = value(a);
      else if (a == "--probe-s")
        o.elastic.probe_s = seconds(a);
      else if (a == "--replica")
        o.elastic.replica = count(a, value(a), 1);
      else if (a == "-h" || a == "--help") {
        fmt::print(
            "loom supervise [--max-restarts N (3)] [--backoff-s S (1, doubling up to 60)] [--log-dir DIR]\n"
            "               [--verdict-grace-s S (30)] [--ranks MIN:MAX [--hosts H:SLOTS,... (else the Slurm\n"
            "               allocation's)] [--probe 'CMD {{host}}'] [--probe-s S (10)] [--replica K (1)]] -- "
            "COMMAND...\n"
            "  runs COMMAND and runs it again (with LOOM_RESTART=k) when it fails for a reason a restart can cure;\n"
            "  not after status 0, 2 (usage or config error), or a SIGINT/SIGTERM/SIGHUP/SIGUSR1 to the supervisor.\n"
            "  --ranks: before each run, the hosts that answer the probe take the largest world size from MIN to MAX\n"
            "  (a multiple of K ranks per replica) that the run's config accepts; COMMAND names it with {{ranks}},\n"
            "  {{dp}} (ranks / K) and {{hosts}} (H:SLOTS,... of the hosts used), and resumes its last checkpoint.\n");
        return 0;
      } else
        fail(
            "loom supervise: unknown option '{}'; usage: loom supervise [--max-restarts N] [--backoff-s S] "
            "[--log-dir DIR] [--ranks MIN:MAX --hosts LIST --probe CMD --replica K] -- COMMAND... (--help says more)",
            a);
    } catch (const std::invalid_argument&) {
      fail("loom supervise: {} takes a number", a);
    }
  }
  for (; i < argc; ++i) command.push_back(argv[i]);
  elastic_check(o.elastic, command);
  return supervise_run(command, o);
}

}  // namespace loom

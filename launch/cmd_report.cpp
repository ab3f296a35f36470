// `loom report`: one self-contained HTML page of one run or several overlaid.
#include <memory>

#include "launch/command.h"
#include "launch/report.h"
#include "runtime/file.h"

namespace loom {

namespace {
bool html_like(const std::string& head) {
  return head.rfind("<!DOCTYPE html", 0) == 0 || head.rfind("<html", 0) == 0;
}
}  // namespace

void cmd_report_add(CLI::App& app, Commands& out) {
  struct Args {
    std::vector<std::string> dirs;
    std::string out;  // none: report.html, numbered where one exists
  };
  auto a = std::make_shared<Args>();
  auto* report = app.add_subcommand(
      "report", "one HTML page of runs: loss, throughput, MFU, step split, memory, config (several runs overlaid)");
  report->add_option("dirs", a->dirs, "run directories (each run's log.dir)")->required();
  report->add_option("--out", a->out,
                     "the page to write (default report.html, numbered report-2.html, ... where one exists)");
  out.push_back({report, false, [a](const CommandContext&) {
                   // A page replaces only a page: never a run's metrics or config named by mistake.
                   if (!a->out.empty()) output_kind_check(a->out, "an HTML page", &html_like, "--out");
                   report_write(a->dirs, a->out);
                   return 0;
                 }});
}

}  // namespace loom

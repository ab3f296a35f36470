#include "launch/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "launch/log_dir.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/json_read.h"

namespace loom {

namespace {

// Ten distinct colours: the memory chart's nine parts each get their own.
constexpr int kNumColors = 10;
const char* kColors[kNumColors] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
// An SVG that scales down to the page's width (never wider than drawn).
std::string svg_open(double w, double h) {
  return fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{0}' height='{1}' viewBox='0 0 {0} {1}' "
      "style='max-width:100%;height:auto' font-family='sans-serif' font-size='11'>",
      w, h);
}

// The page shows a run's config.toml and run.json as they are: "" where missing or refused.
std::string text_of(const std::string& path) {
  try {
    return input_read_all(path, "", int64_t(16) << 20);
  } catch (const Error&) {
    return "";
  }
}

std::string text_or(const nlohmann::json& j, const char* key, const std::string& fallback = "") {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s)
    out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '"' ? "&quot;" : std::string(1, c);
  return out;
}

double num_or(const nlohmann::json& j, const char* key, double fallback = 0) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

// About `n` round tick values covering [lo, hi] (steps of 1, 2 or 5 x 10^k).
std::vector<double> ticks(double lo, double hi, int n = 5) {
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  std::vector<double> out;
  if (!(std::isfinite(step) && step > 0)) return {lo, hi};
  // Bounded by a count of iterations, not by values: above 2^53 neither k + 1 nor t + step need
  // differ from what it was, and a loop on them would never end.
  const double k0 = std::ceil(lo / step), k1 = std::floor(hi / step + 1e-9);
  for (int i = 0; i <= 4 * n; ++i) {
    const double k = k0 + i;
    if (k > k1) break;
    const double t = std::abs(k) < 1e-9 ? 0 : k * step;
    if (out.empty() || t > out.back()) out.push_back(t);
  }
  return out;
}

std::string tick_label(double v) {
  return std::abs(v) >= 1e4 || (v != 0 && std::abs(v) < 1e-2) ? fmt::format("{:.2g}", v) : fmt::format("{:g}", v);
}

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> xy;
};

constexpr double W = 560, H = 300, L = 64, R = 16, T = 34, B = 40;

// A chart wide enough for its title (13 px bold: at most about 0.62 em a character), so that no
// title is cut at the chart's edge.
double title_width(const std::string& title) {
  return L + 0.62 * 13 * double(title.size()) + R;
}

// A line chart of several series over a shared x axis.
std::string svg_lines(const std::string& title, const std::string& xlabel, const std::vector<Series>& series) {
  // Several series: their legend in rows of three under the chart, off the data.
  constexpr int kPerRow = 3;
  const int legend_rows = series.size() > 1 ? int((series.size() + kPerRow - 1) / kPerRow) : 0;
  const double height = H + 16 * legend_rows + (legend_rows ? 6 : 0);
  const double w = std::max(W, title_width(title));
  std::string out = svg_open(w, height) +
                    fmt::format("<text x='{}' y='18' font-size='13' font-weight='bold'>{}</text>", L, escape(title));
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (auto& s : series)
    for (auto [x, y] : s.xy)
      if (std::isfinite(y)) x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (!std::isfinite(x0)) return out + fmt::format("<text x='{}' y='{}'>no data</text></svg>", L, H / 2);
  if (x1 == x0) x1 = x0 + 1;
  // Values that differ in their last digits only (learning rates an ulp apart) chart as flat.
  const bool flat = y1 - y0 <= 1e-9 * std::max(std::abs(y0), std::abs(y1));
  const double pad = !flat ? 0.05 * (y1 - y0) : std::max(1e-9, 0.05 * std::abs(y0));
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (w - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  out +=
      fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='none' stroke='#999'/>", L, T, w - L - R, H - T - B);
  for (double t : ticks(y0, y1))
    out += fmt::format(
        "<line x1='{0}' x2='{1}' y1='{2:.1f}' y2='{2:.1f}' stroke='#eee'/><text x='{3}' y='{4:.1f}' "
        "text-anchor='end'>{5}</text>",
        L, w - R, py(t), L - 4, py(t) + 4, tick_label(t));
  for (double t : ticks(x0, x1))
    out += fmt::format("<text x='{:.1f}' y='{}' text-anchor='middle'>{}</text>", px(t), H - B + 14, tick_label(t));
  out += fmt::format("<text x='{}' y='{}' text-anchor='middle'>{}</text>", (L + w - R) / 2, H - 6, escape(xlabel));
  for (size_t i = 0; i < series.size(); ++i) {
    std::string pts;
    for (auto [x, y] : series[i].xy)
      if (std::isfinite(y)) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    const char* c = kColors[i % kNumColors];
    out += series[i].xy.size() == 1
               ? fmt::format("<circle cx='{}' r='3' fill='{}' cy='{}'/>", pts.substr(0, pts.find(',')), c,
                             pts.substr(pts.find(',') + 1))
               : fmt::format("<polyline fill='none' stroke='{}' stroke-width='1.5' points='{}'/>", c, pts);
    if (series.size() > 1) {
      const double lx = L + double(i % kPerRow) * (w - L - R) / kPerRow, ly = H + 8 + 16 * double(i / kPerRow);
      out += fmt::format("<rect x='{}' y='{}' width='10' height='3' fill='{}'/><text x='{}' y='{}'>{}</text>", lx,
                         ly - 4, c, lx + 14, ly, escape(series[i].name));
    }
  }
  return out + "</svg>";
}

struct Bar {
  std::string label;
  std::vector<double> parts;  // one per part name; zeros are skipped
};

// Stacked bars: one per Bar, its parts stacked in the order of `parts`.
std::string svg_stacked(const std::string& title, const std::string& unit, const std::vector<std::string>& parts,
                        const std::vector<Bar>& bars) {
  const double w = std::max({W, L + R + 150 + 90 * double(bars.size()), title_width(title)});
  std::string out =
      svg_open(w, H) + fmt::format("<text x='{}' y='18' font-size='13' font-weight='bold'>{}</text>", L, escape(title));
  double top = 0;
  for (auto& b : bars) {
    double s = 0;
    for (double v : b.parts) s += std::max(0.0, v);
    top = std::max(top, s);
  }
  if (top <= 0) return out + fmt::format("<text x='{}' y='{}'>no data</text></svg>", L, H / 2);
  top *= 1.05;
  auto py = [&](double y) { return H - B - y / top * (H - T - B); };
  for (double t : ticks(0, top))
    out += fmt::format(
        "<line x1='{0}' x2='{1}' y1='{2:.1f}' y2='{2:.1f}' stroke='#eee'/><text x='{3}' y='{4:.1f}' "
        "text-anchor='end'>{5}</text>",
        L, w - R - 150, py(t), L - 4, py(t) + 4, tick_label(t));
  out += fmt::format("<text x='12' y='{}' transform='rotate(-90 12 {})' text-anchor='middle'>{}</text>",
                     (T + H - B) / 2, (T + H - B) / 2, escape(unit));
  const double slot = (w - L - R - 150) / double(bars.size()), bw = std::min(60.0, slot * 0.6);
  for (size_t i = 0; i < bars.size(); ++i) {
    const double x = L + slot * (double(i) + 0.5) - bw / 2;
    double acc = 0;
    for (size_t k = 0; k < parts.size() && k < bars[i].parts.size(); ++k) {
      const double v = std::max(0.0, bars[i].parts[k]);
      if (v <= 0) continue;
      out += fmt::format(
          "<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='{}'><title>{}: {:.4g} {}</title></rect>", x,
          py(acc + v), bw, py(acc) - py(acc + v), kColors[k % kNumColors], escape(parts[k]), v, escape(unit));
      acc += v;
    }
    out += fmt::format("<text x='{:.1f}' y='{}' text-anchor='middle'>{}</text>", x + bw / 2, H - B + 14,
                       escape(bars[i].label));
    out += fmt::format("<text x='{:.1f}' y='{:.1f}' text-anchor='middle'>{:.4g}</text>", x + bw / 2, py(acc) - 3, acc);
  }
  for (size_t k = 0; k < parts.size(); ++k)
    out +=
        fmt::format("<rect x='{}' y='{}' width='10' height='10' fill='{}'/><text x='{}' y='{}'>{}</text>", w - R - 140,
                    T + 14 * double(k), kColors[k % kNumColors], w - R - 126, T + 9 + 14 * double(k), escape(parts[k]));
  return out + "</svg>";
}

Series series_of(const RunRecord& r, const std::function<double(const nlohmann::json&)>& f) {
  Series s{r.name, {}};
  for (auto& [step, j] : r.steps) s.xy.push_back({double(step), f(j)});
  return s;
}

// A run's tokens/s and MFU as its summary computes them: the tokens of the timed steps over
// their time (each step's own rate weighted by its time).
struct RunRates {
  double tokens_per_s = 0, mfu = 0;
  std::vector<int64_t> timed;
};
RunRates run_rates(const RunRecord& r) {
  RunRates out;
  double ms = 0, tokens = 0, flops = 0;
  for (auto& [step, j] : r.steps) {
    const double t = num_or(j, "step_ms");
    if (r.warmup.count(step) || !(t > 0)) continue;
    out.timed.push_back(step);
    ms += t, tokens += num_or(j, "tokens_per_s") * t, flops += num_or(j, "mfu") * t;
  }
  if (ms > 0) out.tokens_per_s = tokens / ms, out.mfu = flops / ms;
  return out;
}

// "2-30", or "2-10, 12-30" where a restart's warm-up step sits between.
std::string steps_text(const std::vector<int64_t>& steps) {
  std::string out;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] == steps[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + (j > i ? fmt::format("{}-{}", steps[i], steps[j]) : fmt::format("{}", steps[i]));
    i = j + 1;
  }
  return out;
}

}  // namespace

std::vector<RunRecord> report_read(const std::string& dir) {
  RunRecord r;
  r.dir = dir;
  r.name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (r.name.empty()) r.name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
  const std::string metrics = dir + "/metrics.jsonl";
  std::error_code ec;
  LOOM_CHECK(std::filesystem::exists(metrics, ec) || std::filesystem::is_symlink(metrics, ec),
             "'{}' has no metrics.jsonl; give loom report the log.dir of a run, or a directory of them", dir);
  std::istringstream in(input_read_all(metrics, "the run's metrics", int64_t(4) << 30));
  std::string line;
  std::vector<RunRecord> runs;
  bool fresh_run = true;           // the first step line after a header (or the file's first) is a warm-up
  int64_t lines = 0, records = 0;  // a wholly damaged file is said to be, not "no step yet"
  for (int n = 1; std::getline(in, line); ++n) {
    lines += !line.empty();
    nlohmann::json j;
    try {
      if (!json_depth_problem(line).empty()) continue;  // no line loom writes nests deep
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      continue;  // a line cut by a kill: the runs before and after it still read
    }
    if (!j.is_object()) continue;  // not a line loom wrote
    ++records;
    if (j.contains("split_ms") && j["split_ms"].is_object()) r.split = j;
    if (j.contains("run")) {  // a new run: from its first step on, the earlier run's steps are replaced
      fresh_run = true;
      continue;
    }
    if (!j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    if (fresh_run && j.contains("loss")) {
      // A run from step 1 after steps of another (logs from before each run had a directory of
      // its own) is a run of its own; a resume from step k replaces k onwards and keeps 1..k-1.
      if (step <= 1 && !r.steps.empty()) {
        runs.push_back(std::move(r));
        r = RunRecord{};
        r.dir = runs.back().dir, r.name = runs.back().name;
      }
      r.steps.erase(r.steps.lower_bound(step), r.steps.end());
      r.val.erase(r.val.lower_bound(step), r.val.end());
      r.warmup.erase(r.warmup.lower_bound(step), r.warmup.end());
      r.warmup.insert(step);
      fresh_run = false;
    }
    if (j.contains("loss")) r.steps[step] = j;
    if (j.contains("val_loss") && j["val_loss"].is_number()) r.val[step] = j["val_loss"].get<double>();
  }
  LOOM_CHECK(records > 0 || lines == 0,
             "'{}/metrics.jsonl' holds {} and none is a record loom writes (a JSON object per line): it is "
             "damaged, or not a run's metrics",
             dir, plural(lines, "line"));
  LOOM_CHECK(!r.steps.empty() || !runs.empty(), "'{}/metrics.jsonl' holds no step yet", dir);
  if (!r.steps.empty()) runs.push_back(std::move(r));
  // config.toml and run.json are the last run's.
  runs.back().config = text_of(dir + "/config.toml");
  runs.back().facts = text_of(dir + "/run.json");
  if (runs.size() > 1)
    for (size_t i = 0; i < runs.size(); ++i) runs[i].name += fmt::format(" (run {})", i + 1);
  return runs;
}

std::vector<std::string> report_dirs(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir + "/metrics.jsonl", ec) || std::filesystem::is_symlink(dir + "/metrics.jsonl", ec) ||
      !std::filesystem::is_directory(dir, ec))
    return {dir};
  // A directory of runs (runs/, with default, default-2, ...): each one that holds metrics, in
  // order of name, numbers by value (default-2 before default-10).
  std::vector<std::string> out;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (std::filesystem::exists(it->path() / "metrics.jsonl", ec)) out.push_back(it->path().string());
  auto key = [](const std::string& p) {
    const std::string name = std::filesystem::path(p).filename().string();
    const size_t dash = name.find_last_of('-');
    const bool numbered = dash != std::string::npos && dash + 1 < name.size() && dash + 10 > name.size() &&
                          name.find_first_not_of("0123456789", dash + 1) == std::string::npos;
    return numbered ? std::pair<std::string, int64_t>{name.substr(0, dash), std::stoll(name.substr(dash + 1))}
                    : std::pair<std::string, int64_t>{name, 1};
  };
  std::sort(out.begin(), out.end(), [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
  return out.empty() ? std::vector<std::string>{dir} : out;
}

std::string report_html(const std::vector<RunRecord>& runs) {
  auto lines = [&](const char* title, const std::function<double(const nlohmann::json&)>& f) {
    std::vector<Series> s;
    for (auto& r : runs) s.push_back(series_of(r, f));
    return svg_lines(title, "step", s);
  };
  std::vector<Series> val;
  for (auto& r : runs) {
    Series s{r.name, {}};
    for (auto [step, v] : r.val) s.xy.push_back({double(step), v});
    val.push_back(s);
  }
  // The mean step after each run's first (a warm-up), by where the time went.
  const std::vector<std::string> parts = {"compute", "comm exposed",  "bubble", "optimizer",
                                          "data",    "ckpt blocking", "other"};
  const char* keys[] = {"compute_ms", "comm_exposed_ms", "bubble_ms", "optimizer_ms", "data_ms", "ckpt_block_ms"};
  std::vector<Bar> split;
  for (auto& r : runs) {
    Bar b{r.name, std::vector<double>(parts.size(), 0.0)};
    int n = 0;
    double step_ms = 0;
    for (auto it = std::next(r.steps.begin()); it != r.steps.end(); ++it, ++n) {
      for (size_t k = 0; k < 6; ++k) b.parts[k] += num_or(it->second.value("time", nlohmann::json::object()), keys[k]);
      step_ms += num_or(it->second, "step_ms");
    }
    if (n == 0) continue;
    double sum = 0;
    for (size_t k = 0; k < 6; ++k) sum += b.parts[k] /= n;
    b.parts[6] = std::max(0.0, step_ms / n - sum);
    split.push_back(b);
    if (!r.split.is_null()) {
      const nlohmann::json& s = r.split["split_ms"];
      const nlohmann::json p = s.contains("predicted") ? s["predicted"] : nlohmann::json::object();
      split.push_back(
          {r.name + " (predicted)",
           {num_or(p, "compute"), num_or(p, "comm_exposed"), num_or(p, "bubble"), num_or(p, "optimizer"), 0, 0, 0}});
    }
  }
  const std::vector<std::string> mem_parts = {"params",    "grads", "master",      "optim",        "activations",
                                              "workspace", "comm",  "ledger peak", "resident peak"};
  const char* mem_keys[] = {"params_b", "grads_b", "master_b", "optim_b", "act_b", "workspace_b", "comm_b"};
  std::vector<Bar> mem;
  for (auto& r : runs) {
    const auto& m = r.steps.rbegin()->second.value("mem", nlohmann::json::object());
    Bar live{r.name + " live", std::vector<double>(mem_parts.size(), 0.0)};
    for (size_t k = 0; k < 7; ++k) live.parts[k] = num_or(m, mem_keys[k]) / 1048576.0;
    mem.push_back(live);
    Bar peak{r.name + " peak", std::vector<double>(mem_parts.size(), 0.0)};
    peak.parts[7] = num_or(m, "peak_b") / 1048576.0;
    mem.push_back(peak);
    if (num_or(m, "rss_peak_b") > 0) {
      Bar rss{r.name + " RSS", std::vector<double>(mem_parts.size(), 0.0)};
      rss.parts[8] = num_or(m, "rss_peak_b") / 1048576.0;
      mem.push_back(rss);
    }
  }
  std::string names;
  for (auto& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  std::string html = fmt::format(
      "<!DOCTYPE html><html><head><meta charset='utf-8'><title>loom report: {}</title><style>"
      "body{{font-family:sans-serif;margin:20px;color:#222}} .grid{{display:flex;flex-wrap:wrap;gap:12px}} "
      "pre{{background:#f6f6f6;padding:8px;font-size:11px;max-height:320px;overflow:auto}} "
      "td,th{{padding:2px 10px;text-align:right}} th{{background:#eee}}</style></head><body>"
      "<h1>loom report</h1><p>{}</p>",
      escape(names), escape(names));
  // A row a run, summarised as the run summary does: the last losses, and tokens/s and MFU over
  // the steps timed (each start's first step is a warm-up), which it names.
  html +=
      "<table><tr><th>run</th><th>steps</th><th>last loss</th><th>last val loss</th><th>tokens/s</th><th>MFU</th>"
      "<th>timed steps</th><th>gap to prediction</th></tr>";
  for (auto& r : runs) {
    const RunRates rates = run_rates(r);
    html += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{:.4f}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        escape(r.name), r.steps.rbegin()->first, num_or(r.steps.rbegin()->second, "loss", NAN),
        r.val.empty() ? std::string("-") : fmt::format("{:.4f}", r.val.rbegin()->second),
        rates.timed.empty() ? std::string("-") : fmt::format("{:.0f}", rates.tokens_per_s),
        rates.timed.empty() ? std::string("-") : fmt::format("{:.1f}%", 100 * rates.mfu),
        rates.timed.empty() ? std::string("none (one step: a warm-up)") : steps_text(rates.timed),
        r.split.is_null()                 ? std::string("-")
        : text_or(r.split, "gap").empty() ? std::string("none")
                                          : escape(text_or(r.split, "gap")));
  }
  html += "</table><div class='grid'>";
  html += lines("train loss", [](const nlohmann::json& j) { return num_or(j, "loss", NAN); });
  html += svg_lines("validation loss", "step", val);
  html += lines("tokens/s", [](const nlohmann::json& j) { return num_or(j, "tokens_per_s", NAN); });
  html += lines("MFU (%)", [](const nlohmann::json& j) { return 100 * num_or(j, "mfu", NAN); });
  html += lines("learning rate", [](const nlohmann::json& j) { return num_or(j, "lr", NAN); });
  html += lines("gradient norm", [](const nlohmann::json& j) { return num_or(j, "grad_norm", NAN); });
  html += svg_stacked("mean step split (ms)", "ms", parts, split);
  html += svg_stacked("memory, rank 0 (MiB): the ledger at the last step, its peak, the resident peak", "MiB",
                      mem_parts, mem);
  html += "</div>";
  for (auto& r : runs)
    html += fmt::format(
        "<h2>{}</h2><p>{}</p><div class='grid'><div><h3>config.toml</h3><pre>{}</pre></div>"
        "<div><h3>run.json</h3><pre>{}</pre></div></div>",
        escape(r.name), escape(r.dir), escape(r.config.empty() ? "(none)" : r.config),
        escape(r.facts.empty() ? "(none)" : r.facts));
  return html + "</body></html>\n";
}

void report_write(const std::vector<std::string>& dirs, const std::string& out) {
  LOOM_CHECK(!dirs.empty(), "loom report needs at least one run directory (a log.dir)");
  std::vector<RunRecord> runs;
  std::vector<std::string> later;  // runs in numbered siblings of a directory named alone
  for (auto& given : dirs) {
    const std::vector<std::string> each = report_dirs(given);
    for (auto& d : each)
      for (RunRecord& r : report_read(d)) runs.push_back(std::move(r));
    if (each.size() == 1 && each[0] == given)
      for (auto& d : log_dir_family(given))
        if (d != log_dir_family(given).front() && log_dir_holds_run(d)) later.push_back(d);
  }
  // Runs with the same last path component (runs/a/x, runs/b/x) are named by their whole path.
  std::map<std::string, int> named;
  for (auto& r : runs) ++named[r.name];
  for (auto& r : runs)
    if (named[r.name] > 1) r.name = r.dir + r.name.substr(std::min(r.name.size(), r.name.find(" (run ")));
  const std::string html = report_html(runs);
  // No --out: report.html, or report-2.html, -3, ... where it exists (an earlier report stays).
  std::string path = out;
  for (int n = 2; path.empty(); ++n) {
    const std::string name = n == 2 ? "report.html" : fmt::format("report-{}.html", n - 1);
    std::error_code ec;
    if (!std::filesystem::exists(std::filesystem::symlink_status(name, ec))) path = name;
  }
  file_write_atomic(
      path, [&](std::FILE* f) { file_write(f, html.data(), html.size(), path); }, "--out");
  fmt::print("wrote {} ({}, {:.0f} KB)\n", path, plural(runs.size(), "run"), html.size() / 1e3);
  if (!later.empty())
    fmt::print("not drawn: {} (later runs given the same log.dir; name them too, or their parent directory)\n",
               fmt::join(later, ", "));
}

}  // namespace loom

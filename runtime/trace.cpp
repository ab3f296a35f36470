#include "runtime/trace.h"

#include <filesystem>
#include <sstream>

#include "runtime/error.h"
#include "runtime/file.h"

namespace loom {

Trace::Trace(bool enabled, int rank) : enabled_(enabled), rank_(rank), origin_(std::chrono::steady_clock::now()) {
  if (enabled_) events_.reserve(1 << 16);
}

double Trace::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

Trace::Scope::Scope(Trace* t, const char* name, Track track)
    : t_(t), name_(name), track_(track), start_us_(t ? t->now_us() : 0.0) {}

Trace::Scope::~Scope() {
  if (t_) t_->add(name_, track_, start_us_, t_->now_us() - start_us_);
}

void Trace::add(const char* name, Track track, double start_us, double dur_us) {
  if (!recording()) return;
  std::lock_guard lk(mu_);
  events_.push_back({name, track, start_us, dur_us});
}

void Trace::write(const std::string& path) const {
  std::ostringstream out;
  static const char* tracks[] = {"compute", "comm", "host", "gpu"};
  std::lock_guard lk(mu_);
  out << "{\"traceEvents\":[\n";
  for (int t = 0; t < 4; ++t)
    out << fmt::format(
        "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}},\n", rank_, t,
        tracks[t]);
  out << fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"name\":\"rank {}\"}}}}", rank_,
                     rank_);
  for (auto& e : events_)
    out << fmt::format(",\n{{\"name\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f}}}", e.name,
                       rank_, int(e.track), e.start_us, e.dur_us);
  out << "\n]}\n";
  const std::string text = out.str();
  file_write_atomic(
      path, [&](std::FILE* f) { file_write(f, text.data(), text.size(), path); }, "log.dir");
}

void trace_merge(const std::vector<std::string>& parts, const std::string& out) {
  std::string events;
  for (const std::string& path : parts) {
    LOOM_CHECK(std::filesystem::exists(path), "cannot read trace file '{}' to merge (is log.dir shared by every rank?)",
               path);
    const std::string text = input_read_all(path, "log.dir's trace", int64_t(1) << 32);
    const size_t a = text.find('['), b = text.rfind(']');
    LOOM_CHECK(a != std::string::npos && b != std::string::npos && a < b, "'{}' is not a loom trace", path);
    const std::string body = text.substr(a + 1, b - a - 1);
    if (body.find_first_not_of(" \n") == std::string::npos) continue;
    events += (events.empty() ? "" : ",") + body;
  }
  const std::string text = "{\"traceEvents\":[" + events + "]}\n";
  file_write_atomic(
      out, [&](std::FILE* f) { file_write(f, text.data(), text.size(), out); }, "log.dir");
}

}  // namespace loom

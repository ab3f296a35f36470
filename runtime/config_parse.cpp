// The parsers of the config keys whose values have a form of their own (log.trace_steps,
// parallel.pp_layers, the fault.* drills), each a one-line error naming the key and the form;
// the relations between keys are checked in config_validate.cpp.
#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>

#include "runtime/config.h"
#include "runtime/error.h"

namespace loom {

void config_one_of(const std::string& key, const std::string& v, std::initializer_list<const char*> ok) {
  std::string list;
  for (auto* o : ok) {
    if (v == o) return;
    list += (list.empty() ? "" : "|") + std::string(o);
  }
  fail("{} = '{}' is not one of {}", key, v, list);
}

std::pair<int64_t, int64_t> trace_steps_parse(const std::string& spec) {
  return steps_range_parse("log.trace_steps", spec);
}

std::pair<int64_t, int64_t> steps_range_parse(const char* key, const std::string& spec) {
  int64_t a = 0, b = 0;
  char colon = 0, extra = 0;
  const int n = std::sscanf(spec.c_str(), "%" SCNd64 "%c%" SCNd64 "%c", &a, &colon, &b, &extra);
  LOOM_CHECK(n == 3 && colon == ':' && a >= 1 && b >= a,
             "{} = \"{}\": expected \"A:B\", steps A to B with 1 <= A <= B (e.g. \"10:12\")", key, spec);
  return {a, b};
}

std::vector<int> pipeline_layers_given(const Config& cfg) {
  // One count per model chunk: a stage's, or under the interleaved schedule pp x pp_virtual.
  const int v = cfg.parallel.pp_virtual, p = cfg.parallel.pp * v, L = cfg.model.n_layer;
  const char* key = v == 1 ? "parallel.pp" : "parallel.pp x pp_virtual";
  const char* unit = v == 1 ? "stage" : "model chunk";
  std::string spec = cfg.parallel.pp_layers;
  std::erase(spec, ' ');  // "1, 3" reads as "1,3"
  std::vector<int> out;
  if (spec == "auto") {  // balanced where the pipeline is built (parallel/pipeline_split.h)
    LOOM_CHECK(p <= L,
               "parallel.pp_layers = \"auto\": {} model chunks but model.n_layer = {}; every chunk needs a block", p,
               L);
    return {};
  }
  if (spec.empty()) {
    LOOM_CHECK(p <= L, "{} = {} {}s but model.n_layer = {}: every {} needs a block; lower {}", key, p, unit, L, unit,
               key);
    LOOM_CHECK(L % p == 0,
               "{} = {} does not divide model.n_layer = {}; set parallel.pp_layers to the blocks per {}, e.g. \"{}\"",
               key, p, L, unit, [&] {
                 std::string e;
                 for (int s = 0; s < p; ++s) e += (s ? "," : "") + std::to_string(L / p + (s > 0 && s <= L % p));
                 return e;
               }());
    out.assign(size_t(p), L / p);
    return out;
  }
  for (size_t at = 0; at <= spec.size();) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string part = spec.substr(at, comma - at);
    LOOM_CHECK(!part.empty() && part.size() <= 6 &&
                   std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                   std::stoi(part) >= 1,
               "parallel.pp_layers = \"{}\": '{}' is not a positive count of blocks", spec, part);
    out.push_back(std::stoi(part));
    at = comma + 1;
  }
  LOOM_CHECK(int(out.size()) == p, "parallel.pp_layers = \"{}\" gives {} but {} = {}; list one count of blocks per {}",
             spec, plural(out.size(), unit), key, p, unit);
  int sum = 0;
  for (int b : out) sum += b;
  LOOM_CHECK(sum == L,
             "parallel.pp_layers = \"{}\" sums to {} blocks but model.n_layer = {}; make the counts add up to n_layer",
             spec, sum, L);
  return out;
}

FaultAt fault_parse(const std::string& key, const std::string& value, bool rank, bool phases) {
  FaultAt f;
  if (value.empty()) return f;
  const char* form = !rank ? "STEP" : phases ? "RANK:STEP[:PHASE]" : "RANK:STEP";
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t colon = value.find(':', at);
    parts.push_back(value.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  const size_t want = rank ? 2 : 1;
  LOOM_CHECK(parts.size() == want || (phases && parts.size() == 3), "{} = \"{}\": expected {}, e.g. \"{}\"", key, value,
             form,
             !rank    ? "7"
             : phases ? "1:7:backward"
                      : "1:7");
  // Range-checked: a rank of 2^32 must not wrap to 0, nor a step past int64 end in stoll's words.
  auto number = [&](const std::string& p, const char* what, int64_t most) {
    LOOM_CHECK(!p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }),
               "{} = \"{}\": '{}' is not a non-negative number ({})", key, value, p, form);
    int64_t n = -1;
    const auto r = std::from_chars(p.data(), p.data() + p.size(), n);
    LOOM_CHECK(r.ec == std::errc() && n <= most, "{} = \"{}\": {} {} is more than {}; give a {} from 0 to {}", key,
               value, what, p, most, what, most);
    return n;
  };
  if (rank) f.rank = int(number(parts[0], "rank", INT32_MAX));
  f.step = number(parts[rank ? 1 : 0], key == "fault.slow" ? "delay in ms" : "step", INT64_MAX);
  if (parts.size() == 3) {
    f.phase = parts[2];
    config_one_of(key + " phase", f.phase, {"forward", "backward", "optimizer", "checkpoint"});
  }
  return f;
}

}  // namespace loom

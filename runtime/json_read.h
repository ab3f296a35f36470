// JSON that loom reads (manifests, safetensors headers, Hugging Face configs and indexes,
// metrics lines, tokenizer files, flight records): its nesting is bounded before the parser
// sees it (a value nested 200,000 deep overflowed the stack), and what is wrong with it is said
// in loom's words (empty, cut short, not UTF-8, where the syntax breaks), never the library's.
// Not here: what the parsed value must hold (each reader checks its own fields).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace loom {

// Deeper than any JSON loom reads or writes (a manifest nests 5 deep, tokenizer.json 6).
constexpr int kJsonMaxDepth = 512;

// "" when `text` nests arrays and objects at most `max_depth` deep, else what is wrong.
std::string json_depth_problem(std::string_view text, int max_depth = kJsonMaxDepth);
// What is wrong with `text` as JSON ("" when it parses): "is empty", "is cut short", "holds
// bytes that are not UTF-8 at byte N", "breaks off at line L, column C", "nests ... deep".
std::string json_problem(const std::string& text, int max_depth = kJsonMaxDepth);
// `text` parsed (with `cb`, nlohmann's parser callback, where given). Anything else is an Error
// "{what} is not valid JSON: it {problem}", `what` naming where it came from ("'PATH'").
nlohmann::json json_parse(const std::string& text, const std::string& what,
                          const nlohmann::json::parser_callback_t& cb = nullptr);

}  // namespace loom

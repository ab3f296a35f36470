// loom's decoding for the tokenizer tests: each line of stdin a JSON array of ids, each line of
// stdout the JSON string loom's tokenizer decodes them to (ill-formed UTF-8 read as U+FFFD, as
// the references' decoders read their bytes). Not a command of loom's: the tests' tool.
//   loom_tokenizer_decode KIND FILE [MERGES] < ids.jsonl    (KIND: gpt2 | llama3 | hf | spm)
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer.h"
#include "runtime/error.h"
#include "runtime/utf8.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: loom_tokenizer_decode KIND FILE [MERGES] < ids.jsonl\n");
    return 2;
  }
  try {
    const auto tok = loom::tokenizer_open(argv[1], argv[2], argc > 3 ? argv[3] : "");
    LOOM_CHECK(tok != nullptr, "the byte tokenizer has nothing to decode");
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.empty()) continue;
      const std::vector<int32_t> ids = nlohmann::json::parse(line).get<std::vector<int32_t>>();
      fmt::print("{}\n", nlohmann::json(loom::utf8_replace_invalid(tok->decode(ids))).dump());
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 0;
}

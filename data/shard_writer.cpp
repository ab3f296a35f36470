#include "data/shard_writer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>

#include "data/batches.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/launch_env.h"

namespace loom {

namespace {

// `skip`: the shards being written, which a directory of inputs may hold from an earlier run.
std::vector<std::string> files_of(const std::vector<std::string>& inputs, const std::vector<std::string>& skip) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (!fs::is_directory(in, ec)) {
      input_check(in, "input");
      out.push_back(in);
      continue;
    }
    std::vector<std::string> here;
    // With error codes throughout: an entry that cannot be looked at (a loop of symbolic links,
    // a link to nothing) is skipped with a warning, not a filesystem error that ends the run.
    fs::recursive_directory_iterator it(in, fs::directory_options::skip_permission_denied, ec);
    LOOM_CHECK(!ec, "input directory '{}' cannot be read ({})", in, ec.message());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      LOOM_CHECK(!ec, "input directory '{}' cannot be read ({})", in, ec.message());
      const fs::directory_entry& e = *it;
      if (e.path().filename().string()[0] == '.') continue;
      std::error_code kind;
      const bool regular = e.is_regular_file(kind), dir = !kind && e.is_directory(kind);
      if (dir) continue;
      if (!regular) {
        const std::string why = kind.value() == ELOOP ? "a loop of symbolic links"
                                : kind                ? kind.message()
                                : e.is_symlink(kind)  ? "a link to nothing or to something not a file"
                                                      : "not a regular file";
        fmt::print(stderr, "warning: skipping '{}' in input directory '{}': {}\n", e.path().string(), in, why);
        continue;
      }
      const bool output = std::any_of(skip.begin(), skip.end(), [&](const std::string& s) {
        std::error_code same;
        return fs::exists(s, same) && fs::equivalent(e.path(), s, same);
      });
      if (!output) here.push_back(e.path().string());
    }
    std::sort(here.begin(), here.end());
    LOOM_CHECK(!here.empty(), "directory '{}' holds no files", in);
    out.insert(out.end(), here.begin(), here.end());
  }
  return out;
}

std::string read_all(const std::string& path) {
  return input_read_all(path, "input", int64_t(1) << 40);  // regular files only: their size is their own
}

bool blank(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

bool ascii_solid(char c) {
  return uint8_t(c) < 0x80 && !blank(c);
}

// An llm.c token shard opens with its magic: what `loom data` may replace.
bool shard_like(const std::string& head) {
  int32_t magic = 0;
  if (head.size() < sizeof magic) return false;
  std::memcpy(&magic, head.data(), sizeof magic);
  return magic == kShardMagic || magic == kShardMagicU32;
}

std::string val_path_of(const std::string& out) {
  const std::filesystem::path p(out);
  return (p.parent_path() / (p.stem().string() + "_val" + p.extension().string())).string();
}

}  // namespace

std::vector<std::string> text_chunks(const std::string& text, size_t target) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t cut = text.size();
    for (size_t i = begin + target; i + 1 < text.size(); ++i)
      // ASCII on both sides: a byte of a multi-byte character may be white space's.
      if (text[i - 1] == '\n' && i >= 2 && ascii_solid(text[i]) && ascii_solid(text[i - 2])) {
        cut = i;
        break;
      }
    out.push_back(text.substr(begin, cut - begin));
    begin = cut;
  }
  return out;
}

void data_run(const DataOptions& opt) {
  LOOM_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "--val-fraction {} must be in [0, 1)", opt.val_fraction);
  LOOM_CHECK(opt.tokenizer == "byte" || opt.tokenizer == "gpt2" || opt.tokenizer == "llama3",
             "--tokenizer {}: loom has byte, gpt2 (--vocab vocab.json --merges merges.txt) and llama3 (--vocab "
             "tokenizer.model)",
             opt.tokenizer);
  LOOM_CHECK(opt.tokenizer != "gpt2" || (!opt.vocab.empty() && !opt.merges.empty()),
             "--tokenizer gpt2 needs --vocab vocab.json and --merges merges.txt (GPT-2's files; "
             "`tools/tokenizer_files.sh DIR` writes them into DIR)");
  LOOM_CHECK(opt.tokenizer != "llama3" || !opt.vocab.empty(),
             "--tokenizer llama3 needs --vocab tokenizer.model (`tools/tokenizer_files.sh DIR llama3` writes it into "
             "DIR)");
  const std::unique_ptr<Tokenizer> bpe = tokenizer_open(opt.tokenizer, opt.vocab, opt.merges);
  const std::vector<std::string> files = files_of(opt.inputs, {opt.output, val_path_of(opt.output)});
  // Every input is read whole and kept, with its tokens (4 bytes each) beside it: refused up front
  // when that cannot fit (a file's size is its own: a sparse file claims any).
  int64_t total = 0, largest = 0;
  for (const std::string& f : files) {
    const int64_t size = input_check(f, "input");
    total += size;
    largest = std::max(largest, size);
  }
  const double need = double(total) * (bpe ? 2.5 : 5.0) + double(largest);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  LOOM_CHECK(opt.memory_bytes < 0 || need <= double(opt.memory_bytes),
             "loom data reads its inputs whole: {} file{} of {:.1f} GiB{} need{} about {:.1f} GiB with their tokens, "
             "and this machine has {:.1f} GiB ({}); give fewer or smaller files at a time (or split the file)",
             files.size(), files.size() == 1 ? "" : "s", double(total) / kGiB,
             files.size() == 1 ? fmt::format(" ('{}')", files.front()) : "", files.size() == 1 ? "s" : "", need / kGiB,
             double(opt.memory_bytes) / kGiB, opt.memory_from);
  for (const std::string& out : {opt.output, val_path_of(opt.output)}) {
    output_check(out, "the output");
    output_not_input(out, files, "the output");
    output_kind_check(out, "a token shard (the last argument of loom data is the shard it writes)", &shard_like,
                      "the output");
  }
  // Documents are opened by the tokenizer's document token (llm.c's convention), where it has one.
  const int32_t eot = bpe ? bpe->doc_token() : -1;
  const int threads = opt.threads > 0 ? opt.threads : cores_visible();
  const auto t0 = std::chrono::steady_clock::now();

  // Each document's chunks, tokenized by whichever thread is free; a thread keeps its own
  // tokenizer (the BPE's word cache is not shared).
  struct Chunk {
    size_t doc;
    std::string text;
    std::vector<int32_t> ids;
  };
  std::vector<Chunk> chunks;
  size_t bytes = 0;
  for (size_t d = 0; d < files.size(); ++d) {
    try {
      const std::string text = read_all(files[d]);
      bytes += text.size();
      for (std::string& c : text_chunks(text, size_t(1) << 20)) chunks.push_back({d, std::move(c), {}});
    } catch (const std::bad_alloc&) {
      fail(
          "loom data reads its inputs whole, and '{}' ({} bytes) does not fit in memory beside the {} bytes "
          "before it; give fewer or smaller files at a time (or split the file)",
          files[d], input_check(files[d], "input"), bytes);
    }
  }
  const bool progress = ::isatty(2);
  std::atomic<size_t> done_bytes{0};
  std::vector<std::exception_ptr> errors(chunks.size());  // an exception must not leave the region
#pragma omp parallel num_threads(threads)
  {
    std::unique_ptr<Tokenizer> mine;
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < chunks.size(); ++i) {
      try {
        if (bpe && !mine) mine = bpe->clone();
        chunks[i].ids = mine ? mine->encode(chunks[i].text) : tokenize_bytes(chunks[i].text);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      const size_t now = done_bytes += chunks[i].text.size();
      if (progress && omp_get_thread_num() == 0) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        fmt::print(stderr, "\rtokenizing: {:3.0f}% of {:.1f} MB, {:.1f} MB/s", 100.0 * double(now) / double(bytes),
                   double(bytes) / 1e6, double(now) / 1e6 / std::max(s, 1e-9));
      }
    }
  }
  if (progress) fmt::print(stderr, "\r{:60}\r", "");
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);

  // Documents in order, each opened by the end-of-text token (where the tokenizer has one).
  std::vector<std::vector<int32_t>> docs(files.size());
  for (size_t d = 0; d < files.size(); ++d)
    if (eot >= 0) docs[d].push_back(eot);
  for (Chunk& c : chunks) docs[c.doc].insert(docs[c.doc].end(), c.ids.begin(), c.ids.end());
  std::vector<int32_t> train, val;
  size_t val_docs = 0;
  if (opt.val_fraction > 0 && docs.size() > 1) {
    const size_t nval =
        std::clamp<size_t>(size_t(std::ceil(opt.val_fraction * double(docs.size()))), 1, docs.size() - 1);
    val_docs = nval;
    for (size_t d = 0; d < docs.size(); ++d) {
      auto& to = d + nval >= docs.size() ? val : train;
      to.insert(to.end(), docs[d].begin(), docs[d].end());
    }
  } else {
    for (auto& d : docs) train.insert(train.end(), d.begin(), d.end());
    if (opt.val_fraction > 0) {  // one document: its last tokens
      const size_t nval = size_t(std::ceil(opt.val_fraction * double(train.size())));
      LOOM_CHECK(nval > 0 && nval < train.size(), "--val-fraction {} of {} tokens leaves nothing to split",
                 opt.val_fraction, train.size());
      val.assign(train.end() - long(nval), train.end());
      train.resize(train.size() - nval);
    }
  }
  // llm.c's GPT-2 format (uint16) where every id of the vocabulary fits, else LLaMA-3's (uint32).
  const int width = bpe && bpe->vocab_size() > 65536 ? 4 : 2;
  shard_write(opt.output, train, width);
  if (!val.empty()) shard_write(val_path_of(opt.output), val, width);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("wrote {} tokens to {}{} from {} document{} ({:.1f} MB) in {:.2f} s: {:.1f} MB/s on {} thread{}{}\n",
             train.size(), opt.output,
             val.empty() ? "" : fmt::format(" and {} to {}", val.size(), val_path_of(opt.output)), files.size(),
             files.size() == 1 ? "" : "s", double(bytes) / 1e6, s, double(bytes) / 1e6 / std::max(s, 1e-9), threads,
             threads == 1 ? "" : "s",
             eot >= 0 ? fmt::format("; each document opened by {} ({})", bpe->doc_token_text(), eot)
                      : fmt::format("; the {} has no {} token: documents are joined as they are",
                                    bpe ? "vocabulary" : "byte tokenizer", bpe ? bpe->doc_token_text() : "document"));
  // Whole documents are held out: their share of the tokens can be far from --val-fraction.
  if (!val.empty())
    fmt::print("validation: {}, {:.2f}% of the tokens (--val-fraction {} holds out {})\n",
               val_docs > 0 ? fmt::format("the last {} of {} documents", val_docs, docs.size())
                            : std::string("the last tokens of the one document"),
               100.0 * double(val.size()) / double(val.size() + train.size()), opt.val_fraction,
               val_docs > 0 ? "whole documents" : "tokens when there is one document");
}

}  // namespace loom

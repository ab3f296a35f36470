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
#include <optional>

#include "data/batches.h"
#include "data/documents.h"
#include "data/inputs_check.h"
#include "data/line_reader.h"
#include "data/shard_set.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/launch_env.h"

namespace loom {

namespace {

// Whether a file opens with 4 KB of NUL bytes: a hole of a sparse file or a disk image, not text
// (a text may hold a NUL here and there; the tokenizers take them as bytes).
bool opens_with_nuls(const std::string& f) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(f, ec)) return false;  // (the read proper refuses it)
  std::string head(4096, 'x');
  std::FILE* in = std::fopen(f.c_str(), "rb");
  if (!in) return false;  // (the read proper says why)
  const size_t n = std::fread(head.data(), 1, head.size(), in);
  std::fclose(in);
  return n == head.size() && head.find_first_not_of('\0') == std::string::npos;
}

// Why a file is not read as text, or "": named as JSON (its braces and keys would be tokenized
// with the words), or compressed by its name or its first bytes (gzip, zstd).
std::string not_text(const std::string& f) {
  if (name_json(f))
    return "named as JSON; read as text, its braces and keys would be tokenized with the words: pass --format "
           "jsonl to read each record's text (--text-key, default \"text\"), one document a record";
  const char* kind = compression_of(f);
  if (name_compressed(f) || kind)
    return fmt::format(
        "compressed ({}); loom data decompresses JSON Lines (--format jsonl, .jsonl.gz and .jsonl.zst): give the "
        "text decompressed, or as JSON Lines",
        kind ? fmt::format("{} data", kind) : std::string("by its name"));
  if (opens_with_nuls(f)) return "not text: its first 4096 bytes are all NUL (a sparse file's hole, or a disk image)";
  return "";
}

// A text input given by name that is not text: refused, naming the option that reads it (in a
// directory, it is skipped with a warning).
void text_input_check(const std::string& f) {
  if (const std::string why = not_text(f); !why.empty()) fail("'{}' is {}", f, why);
}

// `skip`: the shards being written, which a directory of inputs may hold from an earlier run.
// `jsonl`: a directory's files named as JSON (.jsonl, .json, compressed or not) only.
std::vector<std::string> files_of(const std::vector<std::string>& inputs, const std::vector<std::string>& skip,
                                  bool jsonl) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (!fs::is_directory(in, ec)) {
      input_check(in, "input");
      LOOM_CHECK(!file_is_token_shard(in),
                 "input '{}' is a token shard already (an llm.c header): loom data makes shards of text; train on it "
                 "with data.source = \"tokens\"",
                 in);
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
      std::error_code link_ec;
      if (dir && e.is_symlink(link_ec))  // not followed (it could lead back up): said, not skipped silently
        fmt::print(stderr,
                   "warning: skipping '{}' in input directory '{}': a link to a directory, which loom data does not "
                   "follow (give it as an input of its own)\n",
                   e.path().string(), in);
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
      if (output) continue;
      if (file_is_token_shard(e.path().string())) {
        fmt::print(stderr, "warning: skipping '{}' in input directory '{}': a token shard, not text\n",
                   e.path().string(), in);
        continue;
      }
      if (jsonl && !name_json(e.path().string())) {
        fmt::print(stderr,
                   "warning: skipping '{}' in input directory '{}': not named as JSON Lines (.jsonl, .json, "
                   "compressed .gz or .zst or not)\n",
                   e.path().string(), in);
        continue;
      }
      if (!jsonl)
        if (const std::string why = not_text(e.path().string()); !why.empty()) {
          fmt::print(stderr, "warning: skipping '{}' in input directory '{}': {}\n", e.path().string(), in, why);
          continue;
        }
      here.push_back(e.path().string());
    }
    std::sort(here.begin(), here.end());
    LOOM_CHECK(!here.empty(), "directory '{}' holds no files", in);
    out.insert(out.end(), here.begin(), here.end());
  }
  return out;
}

bool blank(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

bool ascii_solid(char c) {
  return uint8_t(c) < 0x80 && !blank(c);
}

std::string val_path_of(const std::string& out) {
  const std::filesystem::path p(out);
  return (p.parent_path() / (p.stem().string() + "_val" + p.extension().string())).string();
}

}  // namespace

namespace {
bool ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
}  // namespace

bool text_cut_ok(const std::string& text, size_t i, bool word_cuts) {
  if (text[i - 1] == '\n') return i >= 2 && ascii_solid(text[i]) && ascii_solid(text[i - 2]);
  return word_cuts && text[i] == ' ' && i + 1 < text.size() && ascii_letter(text[i + 1]) &&
         (ascii_letter(text[i - 1]) || (text[i - 1] >= '0' && text[i - 1] <= '9'));
}

// The last place at or before the end where `text`, continued by more, may be cut (0: none).
size_t text_last_cut(const std::string& text, bool word_cuts) {
  for (size_t i = text.size(); i-- > 1;)
    if (text_cut_ok(text, i, word_cuts)) return i;
  return 0;
}

std::vector<std::string> text_chunks(const std::string& text, size_t target, bool word_cuts) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t cut = text.size();
    for (size_t i = std::max<size_t>(begin + target, 1); i + 1 < text.size(); ++i)
      if (text_cut_ok(text, i, word_cuts)) {
        cut = i;
        break;
      }
    out.push_back(text.substr(begin, cut - begin));
    begin = cut;
  }
  return out;
}

namespace {

// Where documents go: the training shard, then (from document `first_val` on) the validation
// shard; with one document and a split, its tokens are held to be cut by count at the end.
struct Outputs {
  ShardSet* train = nullptr;
  ShardSet* val = nullptr;
  int64_t first_val = -1;  // -1: no split by documents
  bool hold_one = false;
  std::vector<int32_t> held;
  int64_t val_docs = 0;
  // `opens`: the document's first piece (a text file's later pieces continue it).
  void doc(int64_t index, bool opens, int32_t eot, const std::vector<const std::vector<int32_t>*>& parts) {
    if (hold_one) {
      if (opens && eot >= 0) held.push_back(eot);
      for (auto* p : parts) held.insert(held.end(), p->begin(), p->end());
      return;
    }
    ShardSet* to = first_val >= 0 && index >= first_val ? val : train;
    if (opens && to == val) ++val_docs;
    if (opens && eot >= 0) to->append(&eot, 1);
    for (auto* p : parts) to->append(p->data(), p->size());
  }
};

struct Totals {
  int64_t docs = 0, skipped = 0;
  size_t bytes = 0;
  std::string first_skip;
};

// Reads every document, tokenizes each batch on every thread, and appends the batch in order.
// `cut`: a long document may be cut into pieces for the threads (text_chunks), and a text file
// read in pieces is tokenized piece by piece, each up to its last cut (the rest joins the next).
Totals documents_write(const DataOptions& opt, DocReader& reader, const Tokenizer* bpe, bool cut, int threads,
                       size_t batch_bytes, size_t total_bytes, Outputs& out) {
  const bool jsonl = opt.format == "jsonl";
  const int32_t eot = bpe ? bpe->doc_token() : -1;
  // Before a space between two words too, where GPT-2's and LLaMA-3's pre-tokenizers end a piece
  // (a long line then tokenizes on every thread); another tokenizer was tried on line breaks only.
  const bool word_cuts = !bpe || bpe->kind() == "gpt2" || bpe->kind() == "llama3";
  std::vector<std::unique_ptr<Tokenizer>> mine(static_cast<size_t>(threads));  // each thread's own caches
  const bool progress = ::isatty(2);
  const auto t0 = std::chrono::steady_clock::now();
  Totals t;
  int64_t index = 0;    // of the next record, bad ones included (the validation split counts them)
  std::string carry;    // a text file's bytes after the last cut of its pieces so far
  bool inside = false;  // the batch's first piece continues a document
  struct Chunk {
    size_t doc;
    std::string text;
    std::vector<int32_t> ids;
  };
  std::vector<RawDoc> batch;
  for (bool more = true; more;) {
    batch.clear();
    for (size_t b = 0; b < batch_bytes;) {
      RawDoc d;
      if (!reader.next(d)) {
        more = false;
        break;
      }
      b += d.bytes.size();
      batch.push_back(std::move(d));
    }
    const size_t n = batch.size();
    std::vector<std::string> text(n), why(n);
    std::vector<char> ok(n, 1);
    if (jsonl) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 16)
      for (size_t i = 0; i < n; ++i) {
        if (batch[i].too_long)
          ok[i] = 0, why[i] = fmt::format("longer than {} MB (--max-record)", reader.max_line() >> 20);
        else
          ok[i] = jsonl_record_text(batch[i].bytes, opt.text_key, text[i], why[i]);
        std::string().swap(batch[i].bytes);  // the line's memory back before the next is parsed
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        t.bytes += batch[i].bytes.size();
        text[i] = carry.empty() ? std::move(batch[i].bytes) : carry + batch[i].bytes;
        std::string().swap(batch[i].bytes);
        carry.clear();
        if (batch[i].more) {
          const size_t at = bpe ? text_last_cut(text[i], word_cuts) : text[i].size();
          carry.assign(text[i], at);
          text[i].resize(at);
        }
      }
    }
    std::vector<Chunk> chunks;
    for (size_t i = 0; i < n; ++i) {
      if (!ok[i]) {
        const std::string where = fmt::format("'{}' line {}: {}", reader.files()[batch[i].file], batch[i].line, why[i]);
        LOOM_CHECK(opt.skip_bad, "{} (--skip-bad skips such records and counts them)", where);
        if (t.skipped++ == 0) t.first_skip = where;
        continue;
      }
      if (jsonl) t.bytes += text[i].size();
      if (cut && text[i].size() > (size_t(1) << 20)) {
        for (std::string& c : text_chunks(text[i], size_t(1) << 20, word_cuts)) chunks.push_back({i, std::move(c), {}});
        std::string().swap(text[i]);
      } else if (!text[i].empty()) {
        chunks.push_back({i, std::move(text[i]), {}});
      }
    }
    std::vector<std::exception_ptr> errors(chunks.size());  // an exception must not leave the region
#pragma omp parallel num_threads(threads)
    {
      std::unique_ptr<Tokenizer>& tok = mine[size_t(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
      for (size_t c = 0; c < chunks.size(); ++c) {
        try {
          if (bpe && !tok) tok = bpe->clone();
          chunks[c].ids = tok ? tok->encode(chunks[c].text) : tokenize_bytes(chunks[c].text);
          std::string().swap(chunks[c].text);
        } catch (...) {
          errors[c] = std::current_exception();
        }
      }
    }
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    size_t c = 0;
    for (size_t i = 0; i < n; ++i) {
      const bool opens = !inside;
      inside = batch[i].more;
      if (ok[i]) {
        std::vector<const std::vector<int32_t>*> parts;
        for (; c < chunks.size() && chunks[c].doc == i; ++c) parts.push_back(&chunks[c].ids);
        out.doc(index, opens, eot, parts);
        if (!inside) ++t.docs;
      }
      if (!inside) ++index;
    }
    if (progress) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print(stderr, "\rtokenizing: {}{:.1f} MB, {:.1f} MB/s",
                 total_bytes > 0 ? fmt::format("{:3.0f}% of ", 100.0 * double(t.bytes) / double(total_bytes)) : "",
                 double(total_bytes > 0 ? total_bytes : t.bytes) / 1e6, double(t.bytes) / 1e6 / std::max(s, 1e-9));
    }
  }
  if (progress) fmt::print(stderr, "\r{:60}\r", "");
  return t;
}

// What the documents take, checked against the machine's memory before anything is read: a
// text file is read in pieces, or whole with its tokens beside it where the tokenizer cannot be
// cut (`cut` false; a file's size is its own: a sparse file claims any); JSON Lines a batch of records and the longest
// one, each with the parser's copy of its text and its tokens (4 bytes each), about kRecordBytes per byte (measured: 3
// to 6), and each thread's tokenizer its word cache and the word it merges. Returns the longest record
// (--max-record; by default 64 MB, or what the memory holds, said on stderr).
size_t memory_plan(const DataOptions& opt, bool jsonl, bool bpe, bool cut, int threads, size_t batch_bytes,
                   int64_t largest, const std::vector<std::string>& files) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0, kRecordBytes = 8;
  constexpr double kThreadBytes = double(int64_t(64) << 20);
  const double memory = double(opt.memory_bytes);
  if (!jsonl) {
    if (cut) return size_t(1) << 20;  // (read in pieces; a text file has no records)
    const double need = double(largest) * (bpe ? 3.5 : 6.0);
    LOOM_CHECK(opt.memory_bytes < 0 || need <= memory,
               "this tokenizer's pieces depend on the whole text, so loom data reads a text file whole: '{}' of "
               "{:.1f} GiB needs about {:.1f} GiB with its tokens, and this machine has {:.1f} GiB ({}); split the "
               "file, or give its documents as JSON Lines (--format jsonl), which are read a record at a time",
               files.size() == 1 ? files.front() : "the largest file", double(largest) / kGiB, need / kGiB,
               memory / kGiB, opt.memory_from);
    return size_t(1) << 20;  // (a text file has no records)
  }
  const double working = bpe ? double(threads) * kThreadBytes : 0.0;
  auto need = [&](size_t record) { return double(batch_bytes + record) * kRecordBytes + working; };
  size_t max_record = size_t(opt.max_record_mb > 0 ? opt.max_record_mb : 64) << 20;
  if (opt.memory_bytes < 0 || need(max_record) <= memory) return max_record;
  LOOM_CHECK(opt.max_record_mb == 0,
             "--max-record {} MB: a batch of records ({} MB on {}) and one of {} MB take about {:.1f} GiB with "
             "their tokens, and this machine has {:.1f} GiB ({}); lower --max-record or --threads",
             opt.max_record_mb, batch_bytes >> 20, plural(threads, "thread"), opt.max_record_mb,
             need(max_record) / kGiB, memory / kGiB, opt.memory_from);
  const double room = (memory - working) / kRecordBytes - double(batch_bytes);
  max_record = room > 0 ? (size_t(room) >> 20) << 20 : 0;
  LOOM_CHECK(max_record >= (size_t(1) << 20),
             "JSON Lines on {} take about {:.1f} GiB with records of 1 MB, and this machine has {:.1f} GiB "
             "({}); lower --threads",
             plural(threads, "thread"), need(size_t(1) << 20) / kGiB, memory / kGiB, opt.memory_from);
  if (!opt.quiet)
    fmt::print(stderr,
               "note: records up to {} MB, what this machine's memory holds ({:.1f} GiB, {}); a longer one is a bad "
               "record (--max-record chooses)\n",
               max_record >> 20, memory / kGiB, opt.memory_from);
  return max_record;
}

}  // namespace

void data_run(const DataOptions& opt) {
  LOOM_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "--val-fraction {} must be in [0, 1)", opt.val_fraction);
  LOOM_CHECK(opt.format == "text" || opt.format == "jsonl", "--format {}: loom data reads text and jsonl", opt.format);
  LOOM_CHECK(opt.format == "jsonl" || (opt.text_key == "text" && !opt.skip_bad),
             "--text-key and --skip-bad are for JSON Lines records; pass --format jsonl");
  LOOM_CHECK(!opt.text_key.empty(), "--text-key is empty; name the key that holds each record's text");
  const bool file_kind = opt.tokenizer == "hf" || opt.tokenizer == "spm";
  LOOM_CHECK(file_kind || opt.tokenizer == "byte" || opt.tokenizer == "gpt2" || opt.tokenizer == "llama3",
             "--tokenizer {}: loom has byte, gpt2 (--vocab vocab.json --merges merges.txt), llama3 (--vocab "
             "tokenizer.model), hf and spm (--tokenizer-file)",
             opt.tokenizer);
  LOOM_CHECK(opt.tokenizer != "gpt2" || (!opt.vocab.empty() && !opt.merges.empty()),
             "--tokenizer gpt2 needs --vocab vocab.json and --merges merges.txt (GPT-2's files; "
             "`tools/tokenizer_files.sh DIR` writes them into DIR)");
  LOOM_CHECK(opt.tokenizer != "llama3" || !opt.vocab.empty(),
             "--tokenizer llama3 needs --vocab tokenizer.model (`tools/tokenizer_files.sh DIR llama3` writes it into "
             "DIR)");
  LOOM_CHECK(!file_kind || !opt.tokenizer_file.empty(),
             "--tokenizer {} needs --tokenizer-file ({}; `tools/tokenizer_files.sh DIR qwen3` writes Qwen3's "
             "tokenizer.json into DIR)",
             opt.tokenizer, opt.tokenizer == "hf" ? "a Hugging Face tokenizer.json" : "a SentencePiece model");
  LOOM_CHECK(file_kind == !opt.tokenizer_file.empty() && (file_kind ? opt.vocab.empty() && opt.merges.empty() : true),
             "--tokenizer-file is for --tokenizer hf and spm; --vocab and --merges for gpt2 and llama3");
  const std::unique_ptr<Tokenizer> bpe =
      tokenizer_open(opt.tokenizer, file_kind ? opt.tokenizer_file : opt.vocab, opt.merges);
  const bool jsonl = opt.format == "jsonl";
  const std::string val_path = val_path_of(opt.output);
  std::vector<std::string> outputs_there = {opt.output, val_path};  // (with an earlier run's numbered shards)
  for (const std::string& o : {opt.output, val_path})
    for (std::string& n : shards_numbered_existing(o)) outputs_there.push_back(std::move(n));
  const std::vector<std::string> files = files_of(opt.inputs, outputs_there, jsonl);
  int64_t total = 0, largest = 0;
  for (const std::string& f : files) {
    if (!jsonl) text_input_check(f);
    const int64_t size = input_check(f, "input");
    total += size;
    largest = std::max(largest, size);
  }
  const int threads = opt.threads > 0 ? opt.threads : cores_visible();
  const size_t batch_bytes = std::max<size_t>(size_t(8) << 20, size_t(threads) << 21);
  const bool cut = !bpe || bpe->cuts_at_lone_newlines();  // (tried on the tokenizer: before the clock)
  const size_t max_line = memory_plan(opt, jsonl, bpe != nullptr, cut, threads, batch_bytes, largest, files);
  for (const std::string& out : {opt.output, val_path}) {
    output_check(out, "the output");
    output_not_input(out, files, "the output");
    output_kind_check(out, "a token shard (the last argument of loom data is the shard it writes)", &shard_head,
                      "the output");
  }
  // Documents are opened by the tokenizer's document token (llm.c's convention), where it has one.
  const int32_t eot = bpe ? bpe->doc_token() : -1;
  TokenizerRecord record;
  record.kind = bpe ? bpe->kind() : "byte";
  record.vocab_size = bpe ? int64_t(bpe->vocab_size()) : 256;
  record.doc_token = eot;
  if (bpe) {
    record.files = bpe->files();
    record.hash = files_hash(record.files);
  }
  // llm.c's GPT-2 format (uint16) where every id of the vocabulary fits, else LLaMA-3's (uint32).
  const int width = record.vocab_size > 65536 ? 4 : 2;
  const auto t0 = std::chrono::steady_clock::now();

  // The split: the last documents (counted first, for JSON Lines), or one document's last tokens.
  Outputs out;
  int64_t ndocs = -1;
  if (opt.val_fraction > 0) {
    ndocs = jsonl ? 0 : int64_t(files.size());
    if (jsonl)
      for (const std::string& f : files) ndocs += jsonl_count_records(f, max_line);
    if (ndocs > 1)
      out.first_val = ndocs - std::clamp<int64_t>(int64_t(std::ceil(opt.val_fraction * double(ndocs))), 1, ndocs - 1);
    else
      out.hold_one = true;
  }
  DocReader reader(files, jsonl, max_line, opt.skip_bad, !jsonl && cut ? size_t(1) << 20 : 0);
  // Both outputs (and their numbered shards) replace their names together, or neither does.
  FileSet outputs("the output");
  const int64_t shard_tokens = opt.shard_tokens > 0 ? opt.shard_tokens : kShardTokensMax;
  ShardSet train(outputs, opt.output, width, record, shard_tokens, files);
  std::optional<ShardSet> val;
  if (opt.val_fraction > 0) val.emplace(outputs, val_path, width, record, shard_tokens, files);
  out.train = &train;
  out.val = val ? &*val : nullptr;
  const Totals t = documents_write(opt, reader, bpe.get(), cut, threads, batch_bytes, jsonl ? 0 : size_t(total), out);
  LOOM_CHECK(t.docs > 0, "the inputs hold no {}{}", jsonl ? "records" : "documents",
             t.skipped > 0 ? fmt::format(" but the {} bad ones skipped (the first: {})", t.skipped, t.first_skip) : "");
  LOOM_CHECK(t.bytes > 0, "{} no text: there is nothing to make a shard of",
             files.size() == 1 ? fmt::format("'{}' holds", files.front()) : std::string("the inputs hold"));
  if (out.hold_one) {
    const size_t nval = size_t(std::ceil(opt.val_fraction * double(out.held.size())));
    LOOM_CHECK(nval > 0 && nval < out.held.size(), "--val-fraction {} of {} tokens leaves nothing to split",
               opt.val_fraction, out.held.size());
    train.append(out.held.data(), out.held.size() - nval);
    val->append(out.held.data() + out.held.size() - nval, nval);
  }
  train.finish();
  if (val) val->finish();
  std::vector<std::string> stale = train.stale();
  if (val)
    for (std::string& s : val->stale()) stale.push_back(std::move(s));
  outputs.commit(stale);
  const int64_t train_tokens = train.count(), val_tokens = val ? val->count() : 0;

  if (opt.quiet) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto named = [](const ShardSet& s) {
    return s.paths().size() == 1
               ? s.paths()[0]
               : fmt::format("{} shards, {} to {}", s.paths().size(), s.paths().front(), s.paths().back());
  };
  fmt::print("wrote {} to {}{} from {} ({:.1f} MB) in {:.2f} s: {:.1f} MB/s on {}{}\n", plural(train_tokens, "token"),
             named(train), val_tokens == 0 ? "" : fmt::format(" and {} to {}", val_tokens, named(*val)),
             plural(t.docs, "document"), double(t.bytes) / 1e6, s, double(t.bytes) / 1e6 / std::max(s, 1e-9),
             plural(threads, "thread"),
             eot >= 0 ? fmt::format("; each document opened by {} ({})", bpe->doc_token_text(), eot)
                      : fmt::format("; the {} has no {} token: documents are joined as they are",
                                    bpe ? "vocabulary" : "byte tokenizer", bpe ? bpe->doc_token_text() : "document"));
  if (train.paths().size() > 1 || (val && val->paths().size() > 1))
    fmt::print("a shard holds at most {} tokens (--shard-tokens): train on the shards' directory (data.path = DIR)\n",
               shard_tokens);
  if (!cut)
    fmt::print(
        "one thread per document: this tokenizer's pieces depend on the whole text, so a document is not cut "
        "for threads (documents are tokenized side by side)\n");
  if (t.skipped > 0)
    fmt::print("skipped {} (--skip-bad); the first: {}\n", plural(t.skipped, "bad record"), t.first_skip);
  // Whole documents are held out: their share of the tokens can be far from --val-fraction.
  if (opt.val_fraction > 0)
    fmt::print("validation: {}, {:.2f}% of the tokens (--val-fraction {} holds out {})\n",
               out.hold_one ? std::string("the last tokens of the one document")
                            : fmt::format("the last {} of {} documents", out.val_docs, t.docs),
               100.0 * double(val_tokens) / double(std::max<int64_t>(val_tokens + train_tokens, 1)), opt.val_fraction,
               out.hold_one ? "tokens when there is one document" : "whole documents");
}

}  // namespace loom

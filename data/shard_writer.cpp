#include "data/shard_writer.h"

#include <fcntl.h>
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
#include "data/inputs_check.h"
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
      if (!output && file_is_token_shard(e.path().string())) {
        fmt::print(stderr, "warning: skipping '{}' in input directory '{}': a token shard, not text\n",
                   e.path().string(), in);
        continue;
      }
      if (!output) here.push_back(e.path().string());
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

bool ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Whether `text` may be cut before byte i (0 < i < size - 1) with every pre-tokenizer's pieces
// unchanged: after a lone '\n' between two ASCII non-blank characters, or before a space
// between an ASCII letter or digit and an ASCII letter (GPT-2's and LLaMA-3's pre-tokenizers
// end a word or number at the space and open " word" as a piece of its own). ASCII on both
// sides: a byte of a multi-byte character may be white space's.
bool cut_ok(const std::string& text, size_t i) {
  if (text[i - 1] == '\n') return i >= 2 && ascii_solid(text[i]) && ascii_solid(text[i - 2]);
  return text[i] == ' ' && ascii_letter(text[i + 1]) &&
         (ascii_letter(text[i - 1]) || (text[i - 1] >= '0' && text[i - 1] <= '9'));
}

// A document read a piece at a time, each piece ending where text_chunks may cut (or at the
// document's end): a document of any length, one line of a gigabyte among them, is tokenized
// in bounded memory. A run of kMaxPiece bytes with no such place (no line break, no space
// between words) is cut anyway: anywhere for the byte tokenizer, which is exact, and between
// two characters for a BPE, with a warning that a word may tokenize otherwise there.
class TextPieces {
 public:
  TextPieces(const std::string& path, bool any_cut) : path_(path), any_cut_(any_cut) {
    input_check(path, "input");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("input cannot read '{}' ({})", path, std::strerror(errno));
  }
  ~TextPieces() { ::close(fd_); }
  TextPieces(const TextPieces&) = delete;
  TextPieces& operator=(const TextPieces&) = delete;
  // The next piece into `piece`; false (and `piece` empty) at the end.
  bool next(std::string& piece) {
    size_t from = 1, need = kPiece;  // cuts before `from` were looked for: there are none
    while (true) {
      while (!eof_ && carry_.size() < need) fill();
      size_t cut = 0;
      if (eof_ && carry_.size() <= kPiece) cut = carry_.size();  // the rest, whole
      if (cut == 0 && carry_.size() >= 3)
        for (size_t c = carry_.size() - 2; c >= std::max<size_t>(from, 1); --c)
          if (any_cut_ || cut_ok(carry_, c)) {
            cut = c;
            break;
          }
      if (cut == 0 && carry_.size() >= kMaxPiece) {
        cut = carry_.size() - 1;
        while (cut > 1 && (uint8_t(carry_[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
        fmt::print(stderr,
                   "warning: '{}' runs {} MB without a line break or a space between words; cut there, a word may "
                   "tokenize differently at that place\n",
                   path_, kMaxPiece >> 20);
      }
      if (cut == 0 && eof_) cut = carry_.size();  // shorter than kMaxPiece: whole
      if (cut > 0 || carry_.empty()) {
        piece.assign(carry_, 0, cut);
        carry_.erase(0, cut);
        return !piece.empty();
      }
      from = carry_.size() - 1;
      need = carry_.size() + kPiece;
    }
  }

 private:
  static constexpr size_t kPiece = size_t(8) << 20, kMaxPiece = size_t(256) << 20;
  void fill() {
    const size_t at = carry_.size();
    carry_.resize(at + kPiece);
    ssize_t n;
    do n = ::read(fd_, carry_.data() + at, kPiece);
    while (n < 0 && errno == EINTR);
    if (n < 0) fail_io("cannot read '{}' ({})", path_, std::strerror(errno));
    carry_.resize(at + size_t(n));
    eof_ = n == 0;
  }
  std::string path_;
  bool any_cut_;
  int fd_ = -1;
  std::string carry_;
  bool eof_ = false;
};

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
    for (size_t i = std::max<size_t>(begin + target, 1); i + 1 < text.size(); ++i)
      if (cut_ok(text, i)) {
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
  int64_t total = 0;
  for (const std::string& f : files) total += input_check(f, "input");
  // Read and tokenized a window at a time, whatever a document's length: a shard holds fewer
  // than 2^31 tokens, and the byte tokenizer makes one of every byte (a sparse file can claim
  // any size: refused here, not after reading it).
  LOOM_CHECK(bpe || total + int64_t(files.size()) < (int64_t(1) << 31),
             "a shard holds fewer than 2^31 tokens, and the byte tokenizer makes one of each of the {} bytes of {}; "
             "give fewer or smaller files at a time (or split the file)",
             total, files.size() == 1 ? fmt::format("'{}'", files.front()) : fmt::format("{} files", files.size()));
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

  // A window of chunks of the documents in order, tokenized by whichever thread is free (a
  // thread keeps its own tokenizer: the BPE's word cache is not shared), then appended to the
  // shard: memory is the window's, whatever the inputs' size.
  struct Chunk {
    size_t doc;
    bool opens;  // its document's first: the document token goes before it
    std::string text;
    std::vector<int32_t> ids;
  };
  const size_t window_bytes =
      std::clamp<size_t>(size_t(threads) * (size_t(4) << 20), size_t(8) << 20, size_t(256) << 20);
  std::vector<Chunk> window;
  size_t held = 0, bytes = 0;
  int64_t text_tokens = 0;
  const bool progress = ::isatty(2);
  auto flush = [&](ShardAppender& out) {
    std::vector<std::exception_ptr> errors(window.size());  // an exception must not leave the region
#pragma omp parallel num_threads(threads)
    {
      std::unique_ptr<Tokenizer> mine;
#pragma omp for schedule(dynamic, 1)
      for (size_t i = 0; i < window.size(); ++i) {
        try {
          if (bpe && !mine) mine = bpe->clone();
          window[i].ids = mine ? mine->encode(window[i].text) : tokenize_bytes(window[i].text);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    }
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (const Chunk& c : window) {
      if (c.opens && eot >= 0) out.append(&eot, 1);
      out.append(c.ids.data(), c.ids.size());
      text_tokens += int64_t(c.ids.size());
      bytes += c.text.size();
    }
    window.clear();
    held = 0;
    if (progress) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print(stderr, "\rtokenizing: {:3.0f}% of {:.1f} MB, {:.1f} MB/s",
                 100.0 * double(bytes) / double(std::max<int64_t>(total, 1)), double(total) / 1e6,
                 double(bytes) / 1e6 / std::max(s, 1e-9));
    }
  };
  auto documents = [&](size_t d0, size_t d1, ShardAppender& out) {
    for (size_t d = d0; d < d1; ++d) {
      TextPieces in(files[d], !bpe);
      bool opens = true;
      std::string piece;
      while (in.next(piece) || opens) {  // an empty document is opened all the same
        std::vector<std::string> chunks = text_chunks(piece, size_t(1) << 20);
        if (chunks.empty()) chunks.emplace_back();
        for (std::string& c : chunks) {
          held += c.size();
          window.push_back({d, opens, std::move(c), {}});
          opens = false;
        }
        if (held >= window_bytes) flush(out);
      }
    }
    flush(out);
  };
  // The validation split: the last documents, or for one document its last tokens.
  const size_t val_docs =
      opt.val_fraction > 0 && files.size() > 1
          ? std::clamp<size_t>(size_t(std::ceil(opt.val_fraction * double(files.size()))), 1, files.size() - 1)
          : 0;
  int64_t train_n = 0, val_n = 0;
  // llm.c's GPT-2 format (uint16) where every id of the vocabulary fits, else LLaMA-3's (uint32).
  const int width = bpe && bpe->vocab_size() > 65536 ? 4 : 2;
  const std::string val_out = val_path_of(opt.output);
  file_write_atomic(opt.output, [&](std::FILE* f) {
    ShardAppender train(f, opt.output, width);
    documents(0, files.size() - val_docs, train);
    if (val_docs > 0 || opt.val_fraction > 0) {
      const int64_t tail = size_t(std::ceil(opt.val_fraction * double(train.count())));
      LOOM_CHECK(val_docs > 0 || (tail > 0 && tail < train.count()),
                 "--val-fraction {} of {} tokens leaves nothing to split", opt.val_fraction, train.count());
      file_write_atomic(val_out, [&](std::FILE* g) {
        ShardAppender val(g, val_out, width);
        if (val_docs > 0)
          documents(files.size() - val_docs, files.size(), val);
        else
          train.move_tail(tail, val);
        LOOM_CHECK(text_tokens > 0, "{} hold{} no text: there is nothing to make a shard of",
                   files.size() == 1 ? fmt::format("'{}'", files.front()) : "the inputs", files.size() == 1 ? "s" : "");
        val.finish();
        val_n = val.count();
      });
    }
    LOOM_CHECK(text_tokens > 0, "{} hold{} no text: there is nothing to make a shard of",
               files.size() == 1 ? fmt::format("'{}'", files.front()) : "the inputs", files.size() == 1 ? "s" : "");
    train.finish();
    train_n = train.count();
  });
  if (progress) fmt::print(stderr, "\r{:60}\r", "");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("wrote {} tokens to {}{} from {} document{} ({:.1f} MB) in {:.2f} s: {:.1f} MB/s on {} thread{}{}\n",
             train_n, opt.output, val_n == 0 ? "" : fmt::format(" and {} to {}", val_n, val_out), files.size(),
             files.size() == 1 ? "" : "s", double(bytes) / 1e6, s, double(bytes) / 1e6 / std::max(s, 1e-9), threads,
             threads == 1 ? "" : "s",
             eot >= 0 ? fmt::format("; each document opened by {} ({})", bpe->doc_token_text(), eot)
                      : fmt::format("; the {} has no {} token: documents are joined as they are",
                                    bpe ? "vocabulary" : "byte tokenizer", bpe ? bpe->doc_token_text() : "document"));
  // Whole documents are held out: their share of the tokens can be far from --val-fraction.
  if (val_n > 0)
    fmt::print("validation: {}, {:.2f}% of the tokens (--val-fraction {} holds out {})\n",
               val_docs > 0 ? fmt::format("the last {} of {} documents", val_docs, files.size())
                            : std::string("the last tokens of the one document"),
               100.0 * double(val_n) / double(val_n + train_n), opt.val_fraction,
               val_docs > 0 ? "whole documents" : "tokens when there is one document");
}

}  // namespace loom

#include "data/spm_tokenizer.h"

#include <unistd.h>

#include <filesystem>
#include <mutex>

#include "data/shared_library.h"
#include "data/spm_abi.h"
#include "data/token_text.h"
#include "runtime/error.h"
#include "runtime/file.h"
#include "runtime/utf8.h"

namespace loom {

namespace {
// libloom_spm.so's functions (data/spm_shim.cpp), opened once per process.
struct Spm {
  void* (*open)(const char*, char*, size_t);
  void (*close)(void*);
  int* (*encode)(const void*, const char*, size_t, size_t*, char*, size_t);
  void (*release)(int*);
  int (*pieces)(const void*);
  int (*bos)(const void*);
  const char* (*piece)(const void*, int, int*);
};

// Why this build cannot open the shim at all, or "".
std::string spm_unavailable() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return "--tokenizer spm is not available in a build with AddressSanitizer or ThreadSanitizer: the SentencePiece "
         "library is opened with RTLD_DEEPBIND, which they abort on; use a build without sanitizers";
#elif !defined(LOOM_SPM_SHIM)
  return "this loom was built without libsentencepiece, which --tokenizer spm reads its models with: install Debian's "
         "libsentencepiece-dev (./setup.sh) and build loom again";
#else
  return "";
#endif
}

const Spm& spm() {
  static Spm f;
  static std::string why;
  static std::once_flag once;
  std::call_once(once, [] {
    why = spm_unavailable();
    if (!why.empty()) return;
    // Beside the binary, else where the build put it: the first there is the one.
    std::vector<std::string> tried;
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) tried.push_back((exe.parent_path() / "libloom_spm.so").string());
#ifdef LOOM_SPM_SHIM
    tried.push_back(LOOM_SPM_SHIM);
#endif
    SharedLibrary lib;
    std::string path, last = "not there";
    for (const std::string& p : tried) {
      if (!std::filesystem::exists(p, ec)) continue;
      path = p;
      lib = SharedLibrary::open(p, true);
      last = lib.error();
      break;
    }
    if (!lib) {
      why = fmt::format(
          "libloom_spm.so (loom's wrapper of the SentencePiece library) beside the loom binary{}: {}; "
          "build loom with Debian's libsentencepiece-dev (./setup.sh)",
          path.empty() ? "" : fmt::format(" ('{}')", path), last);
      return;
    }
    // A shim of another build's interface would be called with the wrong arguments.
    int (*abi)() = nullptr;
    lib.bind(abi, "loom_spm_abi");
    if (!abi || abi() != kSpmAbi) {
      why = fmt::format(
          "'{}' is loom's SentencePiece wrapper of another build (interface {}, this loom's {}): copy the "
          "libloom_spm.so built with this binary beside it, or rebuild",
          path, abi ? std::to_string(abi()) : std::string("without a version"), kSpmAbi);
      lib.close();
      return;
    }
    lib.bind(f.open, "loom_spm_open");
    lib.bind(f.close, "loom_spm_close");
    lib.bind(f.encode, "loom_spm_encode");
    lib.bind(f.release, "loom_spm_release");
    lib.bind(f.pieces, "loom_spm_pieces");
    lib.bind(f.bos, "loom_spm_bos");
    lib.bind(f.piece, "loom_spm_piece");
    if (!lib.missing().empty()) why = fmt::format("'{}' lacks {}; rebuild loom", path, lib.missing());
  });
  LOOM_CHECK(why.empty(), "{}", why);
  return f;
}
}  // namespace

SpmTokenizer::SpmTokenizer(const std::string& path) : path_(std::filesystem::absolute(path).string()) {
  input_check(path, "SentencePiece model");
  const Spm& f = spm();
  char err[512] = {};
  void* sp = f.open(path.c_str(), err, sizeof err);
  LOOM_CHECK(sp,
             "'{}' is not a SentencePiece model ({}); --tokenizer spm reads the .model files SentencePiece writes "
             "(LLaMA-3's tiktoken tokenizer.model is --tokenizer llama3's)",
             path, err);
  sp_ = std::shared_ptr<const void>(sp, [close = f.close](const void* p) { close(const_cast<void*>(p)); });
}

std::vector<int32_t> SpmTokenizer::encode(const std::string& text) const {
  const std::string valid = utf8_replace_invalid(text);
  char err[512] = {};
  size_t n = 0;
  int* ids = spm().encode(sp_.get(), valid.data(), valid.size(), &n, err, sizeof err);
  LOOM_CHECK(ids, "SentencePiece cannot encode the text: {}", err);
  std::vector<int32_t> out(ids, ids + n);
  spm().release(ids);
  return out;
}

std::string SpmTokenizer::decode(const std::vector<int32_t>& ids) const {
  // Piece by piece (the library's own decoding drops a leading space, which a stream of single
  // tokens needs): "\u2581" is a space, byte pieces are their bytes, control tokens nothing.
  std::string s;
  const int size = spm().pieces(sp_.get());
  for (int32_t id : ids) {
    LOOM_CHECK(id >= 0 && id < size, "token id {} is outside the SentencePiece model's {} pieces", id, size);
    int kind = 0;
    const std::string piece = spm().piece(sp_.get(), id, &kind);
    if (kind == 2 || (kind == 1 && byte_piece_decode(piece, s))) continue;
    metaspace_decode(piece, s);
  }
  return s;
}

size_t SpmTokenizer::vocab_size() const {
  return size_t(spm().pieces(sp_.get()));
}
int32_t SpmTokenizer::doc_token() const {
  return spm().bos(sp_.get());
}
std::string SpmTokenizer::doc_token_text() const {
  int kind = 0;
  const int bos = spm().bos(sp_.get());
  return bos >= 0 ? spm().piece(sp_.get(), bos, &kind) : "<s>";
}

}  // namespace loom

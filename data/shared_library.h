// A shared library opened at run time and its symbols looked up by name: how the tokenizers reach
// Oniguruma (hf_pipeline.cpp) and loom's SentencePiece wrapper (spm_tokenizer.cpp) without linking
// them. Not here: where to look for a library, or what its absence means (each caller says that).
#pragma once
#include <string>

namespace loom {

class SharedLibrary {
 public:
  // dlopen(path) with RTLD_NOW | RTLD_LOCAL, and RTLD_DEEPBIND with deep_bind; where it fails,
  // the result is false and error() says why.
  static SharedLibrary open(const std::string& path, bool deep_bind = false);
  explicit operator bool() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }
  // out = the symbol `name` as out's type (a pointer to a function or an object), or null where
  // the library lacks it: the first such name is kept in missing().
  template <class T>
  void bind(T& out, const char* name) {
    out = reinterpret_cast<T>(lookup(name));
  }
  const std::string& missing() const { return missing_; }
  // Unloads it (a library the process keeps using is never closed).
  void close();

 private:
  void* lookup(const char* name);
  void* handle_ = nullptr;
  std::string error_, missing_;
};

}  // namespace loom

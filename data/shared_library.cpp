#include "data/shared_library.h"

#include <dlfcn.h>

namespace loom {

SharedLibrary SharedLibrary::open(const std::string& path, bool deep_bind) {
  SharedLibrary lib;
  lib.handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | (deep_bind ? RTLD_DEEPBIND : 0));
  if (!lib.handle_) {
    const char* e = ::dlerror();
    lib.error_ = e ? e : "cannot be opened";
  }
  return lib;
}

void* SharedLibrary::lookup(const char* name) {
  void* p = handle_ ? ::dlsym(handle_, name) : nullptr;
  if (!p && missing_.empty()) missing_ = name;
  return p;
}

void SharedLibrary::close() {
  if (handle_) ::dlclose(handle_);
  handle_ = nullptr;
}

}  // namespace loom

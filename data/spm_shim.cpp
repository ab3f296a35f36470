// The SentencePiece library behind a C interface, built as its own shared object
// (libloom_spm.so) that SpmTokenizer opens with RTLD_DEEPBIND: Debian's libsentencepiece
// carries a protobuf runtime of its own whose symbols clash with the protobuf loom links
// (TensorBoard's events), and bound deep it uses its own.
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "data/spm_abi.h"

using sentencepiece::SentencePieceProcessor;

extern "C" {

// The interface this shim was built with (data/spm_abi.h): loom checks it before any call.
int loom_spm_abi() {
  return loom::kSpmAbi;
}

void* loom_spm_open(const char* path, char* err, size_t err_len) {
  auto* sp = new SentencePieceProcessor();
  const auto status = sp->Load(path);
  if (!status.ok()) {
    std::snprintf(err, err_len, "%s", status.ToString().c_str());
    delete sp;
    return nullptr;
  }
  return sp;
}

void loom_spm_close(void* sp) {
  delete static_cast<SentencePieceProcessor*>(sp);
}

// The ids of text[0, len), malloc'd (loom_spm_release frees them); null with `err` on failure.
int* loom_spm_encode(const void* sp, const char* text, size_t len, size_t* n, char* err, size_t err_len) {
  std::vector<int> ids;
  const auto status = static_cast<const SentencePieceProcessor*>(sp)->Encode(absl::string_view(text, len), &ids);
  if (!status.ok()) {
    std::snprintf(err, err_len, "%s", status.ToString().c_str());
    return nullptr;
  }
  int* out = static_cast<int*>(std::malloc((ids.size() + 1) * sizeof(int)));
  if (!out) return nullptr;
  std::memcpy(out, ids.data(), ids.size() * sizeof(int));
  *n = ids.size();
  return out;
}

void loom_spm_release(int* ids) {
  std::free(ids);
}

int loom_spm_pieces(const void* sp) {
  return static_cast<const SentencePieceProcessor*>(sp)->GetPieceSize();
}

int loom_spm_bos(const void* sp) {
  return static_cast<const SentencePieceProcessor*>(sp)->bos_id();
}

// A piece's text; *kind: 0 ordinary, 1 a byte (<0xAB>), 2 a control token.
const char* loom_spm_piece(const void* sp, int id, int* kind) {
  const auto* p = static_cast<const SentencePieceProcessor*>(sp);
  *kind = p->IsByte(id) ? 1 : p->IsControl(id) ? 2 : 0;
  return p->IdToPiece(id).c_str();
}

}  // extern "C"

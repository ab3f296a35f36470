// A random-access sequence of token ids: in memory, synthetic, or mapped from shards.
#pragma once
#include <cstdint>

namespace loom {

class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual int64_t num_tokens() const = 0;
  // Tokens [start, start + count) into out.
  virtual void read(int64_t start, int64_t count, int32_t* out) const = 0;
};

}  // namespace loom

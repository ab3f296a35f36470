// What tokens' text stands for, for decoding and for the byte-level pre-tokenizers: GPT-2's
// byte-level alphabet (each byte as a printable stand-in character, as GPT-2, LLaMA-3 and the
// byte-level tokenizer.json files write their vocabularies), and SentencePiece-style pieces
// ("▁" for a space, "<0xAB>" for a byte). Not here: which tokens a text becomes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// GPT-2's byte-level alphabet: byte b as the UTF-8 of its stand-in character, and back.
const std::string& byte_level_char(uint8_t b);
// SentencePiece-style pieces decoded onto `out`: "▁" (U+2581) stands for a space; a byte piece
// "<0xAB>" for its byte (false where `piece` is not one).
void metaspace_decode(std::string_view piece, std::string& out);
bool byte_piece_decode(std::string_view piece, std::string& out);

// Appends the bytes of a byte-level string to `out`; false, with `out` as it was, where a
// character is not in the alphabet (an added token's own text, which stands for itself).
bool byte_level_decode(std::string_view s, std::string& out);

}  // namespace loom

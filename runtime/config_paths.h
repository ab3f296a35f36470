// The config keys that name files and directories, and what a path may not hold: a control
// character (a NUL cuts the path where the C library reads it, and `D/e\u0000.safetensors`
// wrote `D/e`; a newline or escape sequence names a file no one can type). Not here: whether
// the path exists or is of the right kind (each reader and writer checks its own).
#pragma once
#include <string>

#include "runtime/config.h"

namespace loom {

// Refuses (exit 2) a path-valued key holding a control character, naming the key.
void config_paths_check(const Config& cfg);
// The first control character of `s` (U+0000..U+001F, U+007F) as "U+000A at byte 3", or "".
std::string control_char_in(const std::string& s);

}  // namespace loom

// What a run's data keys may not name, refused before anything is opened: validation data that
// is the training data (the same file under any spelling: another path to it, a hard link), a
// mixture naming one file twice, a token shard read as text (its header and ids trained as
// bytes), and data.val_path beside synthetic data (which would never read it). Not here: each
// file's own checks (regular file, size, header), which its reader makes.
#pragma once
#include <string>

#include "runtime/config.h"

namespace loom {

void data_inputs_check(const Config& cfg);
// Whether `path` is a regular file opening with an llm.c token shard's magic.
bool file_is_token_shard(const std::string& path);

}  // namespace loom

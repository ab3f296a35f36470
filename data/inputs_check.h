// What a run's data keys may not name, refused before anything is opened: a mixture naming one
// file twice (under any spelling: another path to it, a hard link), a token shard read as text
// (its header and ids trained as bytes). What runs but is likely a mistake comes back as notes
// to say: validation data that is the training data, data.val_path beside synthetic data (which
// never reads it). Not here: each file's own checks (regular file, size, header), which its
// reader makes.
#pragma once
#include <string>
#include <vector>

#include "runtime/config.h"

namespace loom {

std::vector<std::string> data_inputs_check(const Config& cfg);
// Whether `path` is a regular file opening with an llm.c token shard's magic.
bool file_is_token_shard(const std::string& path);

}  // namespace loom

// What every rank of a job must share: one checkpoint.dir (a directory rank 0 commits holds
// every rank's file only if they all write into it) and the same data files. Ranks with their
// own working directories, or node-local disks, would otherwise commit checkpoints missing
// files and train on different data, silently.
#pragma once
#include <string>
#include <vector>

#include "runtime/config.h"

namespace loom {

// The data files this rank would read (data.path, data.sources, data.val_path), each as its
// size and the xxh64 of its first 4 KiB (a shard's header and first tokens), one line per
// setting: "data.path = 2 files, 4096 bytes, xxh64 1f2e..."; a file that cannot be read is
// described by its error.
std::string data_view(const Config& cfg);

// Rank 0's probe in checkpoint.dir: a new file named for a random nonce, holding it; returns
// "NAME NONCE" for the other ranks to look for ("" where there is no checkpoint.dir to share).
std::string dir_probe_create(const Config& cfg);
// "checkpoint.dir = sees rank 0's probe" or what this rank sees instead.
std::string dir_probe_view(const Config& cfg, const std::string& probe);
void dir_probe_remove(const Config& cfg, const std::string& probe);

// The first disagreement of the ranks' views (by rank; rank 0's is the reference) as loom's
// one-line error text that says what to change, or "" when they agree.
std::string shared_view_disagreement(const std::vector<std::string>& views, const Config& cfg);

}  // namespace loom

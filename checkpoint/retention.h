// What stays in a checkpoint directory: checkpoint.keep's pruning after a commit (which always
// keeps a checkpoint a diverging run can go back to), the removal of the checkpoints a rollback
// or a diverged run leaves behind, and the clean-up of a step directory. Only loom's own files
// are ever removed (a step directory holding anything else stays, with a warning). Not here:
// writing or reading a checkpoint (checkpointer.h, manifest.h).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace loom {

// The names loom writes in a step directory (the manifest, the ranks' files and their
// temporaries); anything else there is someone else's.
bool loom_step_file(const std::string& name);
// What step directory `dir` holds that loom did not write, sorted.
std::vector<std::string> step_dir_foreign(const std::string& dir);
// Up to three names quoted, then "and N more".
std::string names_list(const std::vector<std::string>& names);
// Removes loom's files from a step directory, but for `keep`, and the directory itself once
// nothing is left: the manifest first (it stops being a checkpoint before its files go).
void step_dir_clear(const std::string& dir, const std::set<std::string>& keep, bool quiet);
// Complete as far as can be seen without reading it whole: its manifest reads and every file it
// names is there, a regular file.
bool checkpoint_sound(const std::string& dir);

// checkpoint.keep after the checkpoint of `step` committed under `root`: it and the keep - 1
// newest other sound checkpoints stay, and so does the newest sound one of a step before
// `proven` (a step whose update was applied: the weights of every checkpoint before it gave a
// finite loss and gradient norm), so a run that diverges always keeps one it can go back to.
// Older sound ones go, and so do unfinished ones older than `step`; damaged ones stay.
void checkpoints_prune(const std::string& root, int64_t step, int keep, int64_t proven, bool quiet);
// The newest complete checkpoint under `root` of a step before `before` ("" if none).
std::string checkpoint_newest_before(const std::string& root, int64_t before);
// Removes the checkpoints under `root` (complete or not) of step `from` and later: those of a
// trajectory a rollback left or that diverged. Returns their directories.
std::vector<std::string> checkpoints_remove_from(const std::string& root, int64_t from, bool quiet);

}  // namespace loom

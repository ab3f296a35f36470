// The tokenizer that made a run's token shards, read from their records (data/shards.h) into
// the config: model.vocab_size, data.doc_token and data.tokenizer (with its files, where they
// are still there unchanged) where the config leaves them unset. A vocabulary smaller than the
// tokenizer's, a data.tokenizer other than the one that made the shards, and shards of
// different tokenizers are refused. Shards without a record (llm.c's, an earlier loom's)
// change nothing: they train from the config as before, and so does a run that mixes them with
// recorded ones (said once). The byte tokenizer's record leaves the vocabulary to the config.
#pragma once
#include <string>

#include "data/shards.h"
#include "runtime/config.h"

namespace loom {

// The record the config's token shards share (kind "" where none has one); `warn`: say on
// stderr when the recorded files cannot be named in the config (moved or changed).
TokenizerRecord data_tokenizer_infer(Config& cfg, bool warn);

}  // namespace loom

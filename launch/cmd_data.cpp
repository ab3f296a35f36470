// `loom data`: text or JSON Lines files, or directories of them, to an llm.c token shard
// (data/shard_writer.h).
#include <memory>

#include "data/shard_writer.h"
#include "launch/command.h"
#include "runtime/error.h"

namespace loom {

void cmd_data_add(CLI::App& app, Commands& out) {
  struct Args {
    std::vector<std::string> paths;
    DataOptions opt;
  };
  auto a = std::make_shared<Args>();
  auto* data = app.add_subcommand(
      "data",
      "text or JSON Lines files, or directories of them, to an llm.c token shard: one document per text file or "
      "record, on every thread");
  data->add_option("paths", a->paths, "INPUT... OUTPUT: files or directories, then the shard (.bin)")->required();
  data->add_option("--format", a->opt.format,
                   "text (a file is a document; default) | jsonl (a record is one: .jsonl, .jsonl.gz, .jsonl.zst)")
      ->check(CLI::IsMember({"text", "jsonl"}));
  data->add_option("--text-key", a->opt.text_key, "jsonl: the key of each record's text (default text)");
  data->add_flag("--skip-bad", a->opt.skip_bad,
                 "jsonl: skip records that cannot be read (counted in the summary) instead of stopping at the first");
  data->add_option(
          "--max-record", a->opt.max_record_mb,
          "jsonl: the longest record, in MB (default 64; a longer one is a bad record); memory is planned for it")
      ->check(whole_in(1, 4096));
  data->add_option("--shard-tokens", a->opt.shard_tokens,
                   "a shard's most tokens; more go on in OUTPUT's stem + _000001.bin, _000002.bin, ... (default and "
                   "most 2147483647, what llm.c's header counts)")
      ->check(whole_in(1, 2147483647));
  data->add_option("--tokenizer", a->opt.tokenizer, "byte | gpt2 | llama3 | hf | spm")
      ->check(CLI::IsMember({"byte", "gpt2", "llama3", "hf", "spm"}));
  data->add_option("--tokenizer-file", a->opt.tokenizer_file,
                   "hf: a Hugging Face tokenizer.json; spm: a SentencePiece model (.model)");
  data->add_option("--vocab", a->opt.vocab, "GPT-2 vocab.json (gpt2), or LLaMA-3's tokenizer.model (llama3)");
  data->add_option("--merges", a->opt.merges, "GPT-2 merges.txt (tokenizer gpt2)");
  data->add_option("--val-fraction", a->opt.val_fraction,
                   "this share of the documents (of the tokens, for one) into OUTPUT's stem + _val (default 0: none)");
  data->add_option("--threads", a->opt.threads, "threads (0: every core)")->check(whole_in(0, kThreadsMax));
  out.push_back({data, false, [a](const CommandContext&) {
                   LOOM_CHECK(a->paths.size() >= 2,
                              "loom data needs INPUT... OUTPUT: text files or directories, then the shard");
                   DataOptions opt = a->opt;
                   opt.output = a->paths.back();
                   opt.inputs.assign(a->paths.begin(), a->paths.end() - 1);
                   data_run(opt);
                   return 0;
                 }});
}

}  // namespace loom

// `loom eval` (loss and perplexity of a weights file, any layout) and `loom generate` (one
// process, KV-cached).
#include <memory>

#include "launch/command.h"
#include "launch/infer.h"
#include "runtime/error.h"

namespace loom {

void cmd_infer_add(CLI::App& app, Commands& out) {
  auto eopt = std::make_shared<EvalOptions>();
  auto* eval = app.add_subcommand("eval", "loss and perplexity of a weights file on a data set (any layout)");
  eval->add_option("--from", eopt->from, "weights: a .safetensors file, an index, or a directory")->required();
  eval->add_option("--config", eopt->config, "TOML config (default: the model shape the weights carry)");
  eval->add_option("--set", eopt->sets, "override one key: section.key=value (repeatable)");
  eval->add_option("--data", eopt->data,
                   "token shard, directory of shards, text or JSON Lines file (tokenized with the model's tokenizer; "
                   "default: the config's validation data)");
  eval->add_option("--tokenizer", eopt->tokenizer,
                   "a text or JSON Lines --data is tokenized with: byte | gpt2 | llama3 | hf | spm (default: what "
                   "the weights record, else a tokenizer's files beside them, else byte)")
      ->check(CLI::IsMember({"byte", "gpt2", "llama3", "hf", "spm"}));
  eval->add_option("--vocab", eopt->vocab, "GPT-2 vocab.json (gpt2), or LLaMA-3's tokenizer.model (llama3)");
  eval->add_option("--merges", eopt->merges, "GPT-2 merges.txt (tokenizer gpt2)");
  eval->add_option("--tokenizer-file", eopt->tokenizer_file,
                   "hf: a Hugging Face tokenizer.json; spm: a SentencePiece model");
  eval->add_option("--threads", eopt->threads, "threads per rank (default: train.threads; 0: the node's cores shared)")
      ->check(whole_in(0, kThreadsMax));
  eval->add_option("--batches", eopt->batches,
                   "batches of train.global_batch sequences (default data.val_batches; "
                   "0: all)");
  out.push_back({eval, true, [eopt](const CommandContext& ctx) {
                   eval_run(*eopt, ctx.topt);
                   return 0;
                 }});

  auto gopt = std::make_shared<GenerateOptions>();
  auto* gen = app.add_subcommand("generate", "continue a prompt with a trained model (one process, CPU, KV-cached)");
  gen->add_option("--from", gopt->from, "weights: a .safetensors file, an index, or a directory")->required();
  gen->add_option("--prompt", gopt->prompt, "the text to continue")->required();
  gen->add_option("--config", gopt->config, "TOML config (default: the model shape the weights carry)");
  gen->add_option("--set", gopt->sets, "override one key: section.key=value (repeatable)");
  gen->add_option("--tokenizer", gopt->tokenizer,
                  "byte | gpt2 | llama3 | hf | spm (default: what the weights record, else a tokenizer's files beside "
                  "them, else byte)")
      ->check(CLI::IsMember({"byte", "gpt2", "llama3", "hf", "spm"}));
  gen->add_option("--tokenizer-file", gopt->tokenizer_file,
                  "hf: a Hugging Face tokenizer.json; spm: a SentencePiece model");
  gen->add_option("--vocab", gopt->vocab, "GPT-2 vocab.json (gpt2), or LLaMA-3's tokenizer.model (llama3)");
  gen->add_option("--merges", gopt->merges, "GPT-2 merges.txt (tokenizer gpt2)");
  gen->add_option("--max-new", gopt->max_new, "tokens to generate (default 64, or what the context leaves)")
      ->check(whole_in(0, INT32_MAX));
  // Checked by generate_run: finite and >= 0.
  gen->add_option("--temperature", gopt->temperature, "0: greedy (default); above 0: sampled");
  gen->add_option("--top-k", gopt->top_k, "sample among the k likeliest tokens (0: all)")
      ->check(whole_in(0, INT32_MAX));
  gen->add_option("--seed", gopt->seed, "sampling seed: the same seed, the same text")
      ->check(whole_in(0, INT64_MAX));  // not -1 read as 2^64 - 1
  gen->add_option("--threads", gopt->threads,
                  "threads (default 1: decoding one token gains nothing from more; 0: "
                  "train.threads)")
      ->check(whole_in(0, kThreadsMax));
  out.push_back({gen, false, [gopt](const CommandContext& ctx) {
                   LOOM_CHECK(
                       !ctx.env.distributed() || ctx.env.world == 1,
                       "loom generate runs in one process; launch it without mpirun/srun (it was given {} ranks)",
                       ctx.env.world);
                   generate_run(*gopt);
                   return 0;
                 }});
}

}  // namespace loom

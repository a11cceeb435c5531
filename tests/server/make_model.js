// make_model.js DIR — builds a served-model folder for the server tests: the tiny random fixture weights
// (tests/fixtures/kl-fp32, vocab 512) plus a small tiktoken vocabulary (256 bytes + common English pairs)
// and the Kimi-Linear chat tokens, so chat, text prompts and streaming can be exercised end to end.
'use strict';
const fs = require('fs');
const path = require('path');

const dir = process.argv[2];
if (!dir) { console.error('usage: node make_model.js DIR'); process.exit(2); }
const fixture = path.resolve(__dirname, '../fixtures/kl-fp32');
fs.mkdirSync(dir, { recursive: true });
const weights = path.join(dir, 'model.safetensors');
if (!fs.existsSync(weights)) fs.symlinkSync(path.join(fixture, 'model.safetensors'), weights);
// The end-of-text id moves outside the 512-token vocabulary, so that long test generations are not
// cut short by a random model that happens to sample a byte token chosen as EOS.
const config = JSON.parse(fs.readFileSync(path.join(fixture, 'config.json'), 'utf8'));
config.eos_token_id = 4000;
fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config, null, 1));
const tokens = [];
for (let b = 0; b < 256; b++) tokens.push(Buffer.from([b]));
const pairs = ('th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le ve co me ' +
  'de hi ri ro ic ne ea ra ce li ch ll be ma si om ur').split(' ');
for (const p of pairs) tokens.push(Buffer.from(p));
for (const p of pairs.slice(0, 40)) tokens.push(Buffer.from(' ' + p[0]), Buffer.from(p + ' '));
const seen = new Set();
const lines = [];
for (const t of tokens) {
  const k = t.toString('hex');
  if (seen.has(k) || lines.length >= 480) continue;
  seen.add(k);
  lines.push(t.toString('base64') + ' ' + lines.length);
}
fs.writeFileSync(path.join(dir, 'tiktoken.model'), lines.join('\n') + '\n');
const specials = ['[BOS]', '[EOS]', '<|im_end|>', '<|im_user|>', '<|im_assistant|>', '<|im_system|>', '<|im_middle|>'];
const dec = {};
specials.forEach((s, i) => { dec[String(500 + i)] = { content: s, special: true }; });
fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ added_tokens_decoder: dec }, null, 1));

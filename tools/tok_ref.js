#!/usr/bin/env node
// tok_ref.js — reference token ids from the real tiktoken (npm `tiktoken`, the WASM build of OpenAI's Rust
// tiktoken) for Deltafin's tokenizer tests. Run `npm install` in tools/ first.
//   node tok_ref.js export cl100k_base|o200k_base OUT       write the ranks as `base64 rank` lines
//   node tok_ref.js ids VOCAB PATTERN CORPUS.jsonl [--special]   one JSON id array per corpus line
//   node tok_ref.js bench VOCAB PATTERN TEXTFILE            encode speed in MB/s
//   node tok_ref.js crosscheck DIR                          js-tiktoken (pure JS, V8 regexes) against the
//        expected ids in DIR/expected (tests/tokenizer): a second, independent implementation. It differs
//        from tiktoken where JavaScript's `\s` differs from Unicode White_Space (U+0085, U+FEFF).
// VOCAB: cl100k_base | o200k_base | a tiktoken file.  PATTERN: kimi | cl100k | o200k (the Kimi one uses `&&` class
// intersection, which tiktoken's fancy-regex supports natively, so it is a true reference for ours).
"use strict";
const fs = require("fs");
const { Tiktoken } = require("tiktoken/lite");

const KIMI = require("./kimi_pattern");

// VOCAB may also be a tiktoken-format file (`base64 rank` lines, e.g. models/default/tiktoken.model); it
// is handed to tiktoken in the package's own ranks format, one token per line.
function vocab(name) {
  if (name === "cl100k_base" || name === "o200k_base") return require(`tiktoken/encoders/${name}.json`);
  if (!fs.existsSync(name)) throw new Error(`unknown vocabulary ${name}`);
  const lines = fs.readFileSync(name, "utf8").split("\n").filter(Boolean).map((l) => {
    const [tok, rank] = l.split(" ");
    return `! ${rank} ${tok}`;
  });
  return { bpe_ranks: lines.join("\n"), special_tokens: {}, pat_str: KIMI };
}

function pattern(name) {
  if (name === "kimi") return KIMI;
  if (name === "cl100k") return vocab("cl100k_base").pat_str;
  if (name === "o200k") return vocab("o200k_base").pat_str;
  throw new Error(`unknown pattern ${name}`);
}

function encoder(vname, pname) {
  const v = vocab(vname);
  return new Tiktoken(v.bpe_ranks, v.special_tokens, pattern(pname));
}

// The npm package ships ranks compressed as lines "<first> <offset> tok tok ..." with rank = offset + index.
function exportRanks(vname, out) {
  const lines = [];
  for (const line of vocab(vname).bpe_ranks.split("\n")) {
    if (!line) continue;
    const [, offs, ...toks] = line.split(" ");
    const base = parseInt(offs, 10);
    toks.forEach((t, i) => lines.push([base + i, t]));
  }
  lines.sort((a, b) => a[0] - b[0]);
  fs.writeFileSync(out, lines.map(([r, t]) => `${t} ${r}\n`).join(""));
}

function ids(vname, pname, corpus, special) {
  const enc = encoder(vname, pname);
  const out = [];
  for (const line of fs.readFileSync(corpus, "utf8").split("\n")) {
    if (!line) continue;
    const text = JSON.parse(line);
    const got = special ? enc.encode(text, "all") : enc.encode_ordinary(text);
    out.push(JSON.stringify(Array.from(got)));
  }
  process.stdout.write(out.join("\n") + "\n");
  enc.free();
}

function bench(vname, pname, file) {
  const enc = encoder(vname, pname);
  const text = fs.readFileSync(file, "utf8");
  const bytes = Buffer.byteLength(text);
  let best = Infinity, n = 0;
  for (let i = 0; i < 3; i++) {
    const t0 = process.hrtime.bigint();
    n = enc.encode_ordinary(text).length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(JSON.stringify({ bytes, tokens: n, seconds: best, mb_per_s: bytes / best / 1e6 }));
  enc.free();
}

function crosscheck(dir) {
  const { Tiktoken: JsTiktoken } = require("js-tiktoken/lite");
  for (const [vname, pname] of [["cl100k_base", "cl100k"], ["o200k_base", "o200k"]]) {
    const enc = new JsTiktoken(require(`js-tiktoken/ranks/${vname}`));
    for (const corpus of ["hard_strings", "fuzz_strings"]) {
      const texts = fs.readFileSync(`${dir}/${corpus}.jsonl`, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
      const want = fs.readFileSync(`${dir}/expected/${vname}-${pname}.${corpus}.jsonl`, "utf8").split("\n").filter(Boolean);
      const bad = [];
      texts.forEach((t, i) => { if (JSON.stringify(enc.encode(t, [], [])) !== want[i]) bad.push(i + 1); });
      console.log(`${vname} ${corpus}: js-tiktoken differs from tiktoken on ${bad.length}/${texts.length} lines ${bad.length ? "(" + bad.join(",") + ")" : ""}`);
    }
  }
}

const [cmd, ...a] = process.argv.slice(2);
if (cmd === "export") exportRanks(a[0], a[1]);
else if (cmd === "ids") ids(a[0], a[1], a[2], a[3] === "--special");
else if (cmd === "bench") bench(a[0], a[1], a[2]);
else if (cmd === "crosscheck") crosscheck(a[0]);
else {
  console.error("usage: tok_ref.js export VOCAB OUT | ids VOCAB PATTERN CORPUS [--special] | bench VOCAB PATTERN FILE");
  process.exit(2);
}

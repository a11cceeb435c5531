#!/usr/bin/env node
// encode_check.js — re-tokenises the default model's training text with the real tiktoken (npm `tiktoken`,
// the WASM build of OpenAI's Rust tiktoken, whose regex engine understands the Kimi pattern's `&&`) and
// checks the ids that tools/train_bpe.py wrote.  Usage: node encode_check.js DATA_DIR MODEL_DIR
"use strict";
const fs = require("fs");
const path = require("path");
const { Tiktoken } = require("tiktoken/lite");

const KIMI = require("../kimi_pattern");

const [dataDir, modelDir] = process.argv.slice(2);
const ranks = fs.readFileSync(path.join(modelDir, "tiktoken.model"), "utf8");
const nBpe = ranks.split("\n").filter((l) => l).length;
const cfg = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
const specials = {};
for (const [id, t] of Object.entries(cfg.added_tokens_decoder)) specials[t.content] = Number(id);
const enc = new Tiktoken(ranks, specials, KIMI);
let bad = 0;
for (const split of ["train", "valid", "test"]) {
  const want = new Uint16Array(fs.readFileSync(path.join(dataDir, split + ".ids")).buffer.slice(0));
  const got = [];
  for (const line of fs.readFileSync(path.join(dataDir, split + ".jsonl"), "utf8").split("\n")) {
    if (!line) continue;
    got.push(nBpe, ...enc.encode_ordinary(JSON.parse(line).text));
  }
  let same = got.length === want.length;
  for (let i = 0; same && i < got.length; i++) same = got[i] === want[i];
  console.log(`${same ? "ok" : "not ok"} - ${split}: ${got.length} tiktoken ids vs ${want.length} from train_bpe.py`);
  if (!same) bad++;
}
const chat = "<|im_user|>user<|im_middle|>Hello<|im_end|>";
console.log("chat sample ->", JSON.stringify(Array.from(enc.encode(chat, "all"))));
enc.free();
process.exit(bad ? 1 : 0);

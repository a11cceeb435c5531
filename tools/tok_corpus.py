#!/usr/bin/env python3
"""tok_corpus.py — regenerates the tokenizer test fixtures under tests/tokenizer/:
  hard_strings.jsonl, fuzz_strings.jsonl   corpora, one JSON string per line (valid UTF-8 only: tiktoken takes
                                           str; invalid UTF-8 is tested in test_tokenizer.c / test_tokenize.sh)
  *.tiktoken.gz                            cl100k_base / o200k_base ranks exported from the npm tiktoken package
  expected/VOCAB-PATTERN[-special].*.jsonl ids from the real tiktoken (tools/tok_ref.js); VOCAB default =
                                           models/default/tiktoken.model
  tiny_k3/, tiny_k2/                       byte-level model folders for the chat golden tests
Run from the repository root after `npm install` in tools/:  python3 tools/tok_corpus.py"""
import base64
import json
import os
import random
import subprocess
import sys

S = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm you're we've they'll she'd it's DON'T He'S I'M WE'VE THEY'LL 's 't",
    "rock'n'roll o'clock Ain't y'all'd've",
    "’s curly’t apostrophe’re",
    "1234567890 3.14159 1,000,000 12345678901234567890",
    "\u0661\u0662\u0663\u0664 \uff14\uff15\uff16 \u2460\u2461 \u00bd \u2167",
    "中文字符测试，这是一个句子。",
    "日本語のテキスト、カタカナとひらがな。ｶﾀｶﾅ",
    "한국어 텍스트입니다",
    "Kimi是一个AI助手abc中文DEF混合",
    "中\u0301文 e\u0301 n\u0303 a\u0308\u0304",
    "Z\u0334\u0327\u031ba\u0338l\u0335g\u0336o\u0337 text",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family \U0001F3F3\ufe0f\u200d\U0001F308 flag \U0001F44D\U0001F3FD",
    "emoji\U0001F600\U0001F600\U0001F600 no spaces\U0001F389!",
    "a" + " " * 50 + "b",
    "\n\n\n  \t\t \r\n x",
    "   leading and trailing   ",
    " " * 2000,
    "x\n" + " " * 300 + "\n" + "\t" * 100 + "y",
    "line1\r\nline2\n\n\nline3\r\r\n",
    "\u00a0nbsp\u2003em\u3000ideo \u180e mvs \u0085nel \u2028ls \u2029ps",
    "\x1c\x1d\x1e\x1f controls \x00 nul \x7f del",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5!",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22 \u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8",
    "\U0001D518\U0001D52B\U0001D526\U0001D520\U0001D52C\U0001D521\U0001D522 \U00020000\U00020001 CJK-B",
    "\u01c5 \u01c8 titlecase \u02b0\u02b2 \u30fc\u3005\u3007 modifiers",
    "HTTPServerError camelCaseWord XMLHttpRequest iPhone McDONALD",
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 40,
    "a" * 3000,
    "\u00e9" * 500,
    "\u4e2d" * 800,
    "!!!???...---___***~~~ ;;; $$$ %%% ^^^ &&& |||",
    "def f(x):\n    return x**2  # comment\n\tif (a && b) { c++; }\n",
    "https://example.com/path/to/file.html?q=1&r=2#frag  user@example.org",
    "<|endoftext|> hello <|im_end|> <|fim_prefix|>x<|endofprompt|>",
    "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>",
    "JSON: {\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "Mixed 123abc abc123 1a2b3c 12.34.56 v1.2.3-rc4",
    " \u4e2d\u6587 \uff0c\u3002 \u3010\u3011 \u300c\u300d",
    "\ufeffBOM start \ufffd replacement \u200b zero width \u200d joiner",
    "\U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5 flags \u2764\ufe0f \u263a",
    "tab\tseparated\tvalues\nnew\u000bline\u000cfeed",
]


def fuzz_strings(n=600, seed=7):
    rnd = random.Random(seed)
    pool = list("aAbBzZ eE'sStTdDmMlLrRvV0123456789 \t\n\r.,;:!?-_()[]{}<>\"'/\\|&@#$%^*~`+=")
    pool += list("中文字符日本語한국어éèüñçßøÆЖжΩωλ你好世界\u0301\u0308\u200d\U0001F600\U0001F44D\u00a0\u3000\u2028ー々ǅʰ１２")
    pool += ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "  ", "\n\n", "\r\n"]
    return ["".join(rnd.choice(pool) for _ in range(rnd.choice([1, 2, 3, 5, 8, 13, 30, 60, 120, 400])))
            for _ in range(n)]


def write_jsonl(path, strings):
    with open(path, "w", encoding="utf-8") as f:
        for s in strings:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")


# Tiny model folders: every byte is its own token (id = byte value) plus one merge, "xx" = 256, so chat
# prompts can be derived by hand; specials follow at 257 + (Kimi id - 163584).
K3_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
               6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 254: "[UNK]", 255: "[PAD]"}
K2_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
               6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>", 17: "<|im_middle|>",
               254: "[UNK]", 255: "[PAD]"}


def write_tiny(folder, specials):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tiktoken.model"), "w") as f:
        for b in range(256):
            f.write(f"{base64.b64encode(bytes([b])).decode()} {b}\n")
        f.write(f"{base64.b64encode(b'xx').decode()} 256\n")
    dec = {str(257 + k): {"content": v, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True} for k, v in sorted(specials.items())}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"added_tokens_decoder": dec, "model_max_length": 1048576}, f, indent=1)
        f.write("\n")


def main():
    d = "tests/tokenizer"
    os.makedirs(f"{d}/expected", exist_ok=True)
    write_jsonl(f"{d}/hard_strings.jsonl", S)
    write_jsonl(f"{d}/fuzz_strings.jsonl", fuzz_strings())
    write_tiny(f"{d}/tiny_k3", K3_SPECIALS)
    write_tiny(f"{d}/tiny_k2", K2_SPECIALS)
    ref = ["node", "tools/tok_ref.js"]
    for vocab, own in (("cl100k_base", "cl100k"), ("o200k_base", "o200k")):
        raw = f"{d}/{vocab}.tiktoken"
        subprocess.run(ref + ["export", vocab, raw], check=True)
        subprocess.run(["gzip", "-9nf", raw], check=True)
        for corpus in ("hard_strings", "fuzz_strings"):
            for pat, special in (("kimi", False), (own, False), (own, True)):
                if special and corpus == "fuzz_strings":
                    continue   # the fuzz corpus has no special-token strings
                name = f"{d}/expected/{vocab}-{pat}{'-special' if special else ''}.{corpus}.jsonl"
                with open(name, "w") as f:
                    subprocess.run(ref + ["ids", vocab, pat, f"{d}/{corpus}.jsonl"] + (["--special"] if special else []),
                                   check=True, stdout=f)
    for corpus in ("hard_strings", "fuzz_strings"):   # the bundled model's own vocabulary, Kimi pattern
        with open(f"{d}/expected/default-kimi.{corpus}.jsonl", "w") as f:
            subprocess.run(ref + ["ids", "models/default/tiktoken.model", "kimi", f"{d}/{corpus}.jsonl"],
                           check=True, stdout=f)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Byte-level BPE vocabulary for the bundled default model, in Kimi's tiktoken format, plus a tiktoken-style
encoder used to tokenise the training text.  Pure Python (no numpy needed).

  train   DATA_DIR MODEL_DIR [N_BPE]   learn N_BPE (default 5888) ranks from DATA_DIR/train.jsonl and write
                                       MODEL_DIR/tiktoken.model + MODEL_DIR/tokenizer_config.json
  encode  DATA_DIR MODEL_DIR           write DATA_DIR/{train,valid,test}.ids (uint16 little-endian, one [BOS]
                                       before each document) and DATA_DIR/{split}.bytes.json (bytes per doc)

Vocabulary layout (the same relative layout as Kimi-Linear / K2): ranks 0..255 are the single
bytes in byte order, ranks 256.. are BPE merges in the order they were learnt (so a rank is also the merge
priority tiktoken uses), then 256 reserved special-token slots: [BOS] = N_BPE, [EOS] = N_BPE+1,
<|im_end|> = N_BPE+2 (the config's eos_token_id), ..., [UNK] = N_BPE+254, [PAD] = N_BPE+255.

Pre-tokenisation: the Kimi regex.  Python's `re` has no \\p{..} classes, so `pieces()` is the
exact Kimi regex restricted to ASCII text (letters = A-Za-z, numbers = 0-9, no Han); the Brown text is pure
ASCII, which `pieces()` checks.  At inference the C tokenizer and tiktoken apply the full Unicode regex, which
gives the same pieces on ASCII input; tools/corpus/encode_check.js cross-checks the ids against npm tiktoken.
"""
import base64
import heapq
import json
import os
import re
import struct
import sys

KIMI_PAT = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# The same alternatives over ASCII.  \s is spelled out as the ASCII white-space set Rust's regex uses.
_WS = r"\t\n\x0b\x0c\r "
_SUFFIX = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
ASCII_PAT = re.compile("|".join([
    r"[^\r\nA-Za-z0-9]?[A-Z]*[a-z]+" + _SUFFIX,
    r"[^\r\nA-Za-z0-9]?[A-Z]+[a-z]*" + _SUFFIX,
    r"[0-9]{1,3}",
    rf" ?[^{_WS}A-Za-z0-9]+[\r\n]*",
    rf"[{_WS}]*[\r\n]+",
    rf"[{_WS}]+(?![^{_WS}])",
    rf"[{_WS}]+",
]))

SPECIAL_SLOTS = 256
# Kimi-Linear / K2 named specials as offsets from the first special id (163584 in the real vocabulary).
SPECIALS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
    254: "[UNK]", 255: "[PAD]",
}


def special_tokens(n_bpe):
    """name -> id for all 256 slots (unnamed ones are <|reserved_token_ID|>, as in Kimi's tokenizer)."""
    out = {}
    for off in range(SPECIAL_SLOTS):
        out[SPECIALS.get(off, f"<|reserved_token_{n_bpe + off}|>")] = n_bpe + off
    return out


def pieces(text):
    if not text.isascii():
        raise ValueError("pieces(): the ASCII form of the Kimi regex only covers ASCII text")
    return ASCII_PAT.findall(text)


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


# ---------------------------------------------------------------------------------------------------- training

def train(piece_counts, n_bpe):
    """Classic BPE on byte sequences.  Returns the token byte strings, index = rank."""
    vocab = [bytes([b]) for b in range(256)]
    index = {t: i for i, t in enumerate(vocab)}
    words = [list(p) for p in piece_counts]            # token ids per distinct piece
    counts = list(piece_counts.values())
    pair_count, pair_words = {}, {}
    for w, (ids, c) in enumerate(zip(words, counts)):
        for pair in zip(ids, ids[1:]):
            pair_count[pair] = pair_count.get(pair, 0) + c
            pair_words.setdefault(pair, set()).add(w)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    while len(vocab) < n_bpe and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue                                  # stale heap entry
        merged = vocab[pair[0]] + vocab[pair[1]]
        new = index.get(merged)
        if new is None:                               # another pair may already spell these bytes
            new = len(vocab)
            vocab.append(merged)
            index[merged] = new
        touched = set()
        for w in pair_words.pop(pair, ()):
            ids, c = words[w], counts[w]
            for p in zip(ids, ids[1:]):
                pair_count[p] -= c
                touched.add(p)
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
                    out.append(new)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            words[w] = out
            for p in zip(out, out[1:]):
                pair_count[p] = pair_count.get(p, 0) + c
                pair_words.setdefault(p, set()).add(w)
                touched.add(p)
        pair_count.pop(pair, None)
        for p in touched:
            if p in pair_count:
                if pair_count[p] > 0:
                    heapq.heappush(heap, (-pair_count[p], p))
                else:
                    del pair_count[p]
    if len(vocab) < n_bpe:
        raise SystemExit(f"only {len(vocab)} tokens could be learnt, {n_bpe} asked")
    return vocab


def write_tiktoken(path, vocab):
    with open(path, "w") as f:
        for rank, tok in enumerate(vocab):
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")


def read_tiktoken(path):
    ranks = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
    return ranks


def write_tokenizer_config(path, n_bpe):
    decoder = {}
    for name, i in special_tokens(n_bpe).items():
        decoder[str(i)] = {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True}
    cfg = {
        "added_tokens_decoder": decoder,
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "model_max_length": 512,
        "tokenizer_class": "TikTokenTokenizer",
        "pat_str": KIMI_PAT,
        "chat_template": (
            "{%- for message in messages -%}"
            "{{ '<|im_' + message['role'] + '|>' + message['role'] + '<|im_middle|>' + message['content']"
            " + '<|im_end|>' }}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}{{ '<|im_assistant|>assistant<|im_middle|>' }}{%- endif -%}"),
    }
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------------------------------------------- encoding

def bpe_piece(piece, ranks):
    """tiktoken's merge loop: repeatedly join the adjacent pair whose concatenation has the lowest rank."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return [ranks[p] for p in parts]


class Encoder:
    def __init__(self, ranks):
        self.ranks = ranks
        self.cache = {}

    def encode(self, text):
        out = []
        for p in pieces(text):
            ids = self.cache.get(p)
            if ids is None:
                ids = self.cache[p] = bpe_piece(p.encode(), self.ranks)
            out.extend(ids)
        return out


def cmd_train(data_dir, model_dir, n_bpe):
    counts = {}
    for doc in read_docs(os.path.join(data_dir, "train.jsonl")):
        for p in pieces(doc):
            b = p.encode()
            counts[b] = counts.get(b, 0) + 1
    print(f"{len(counts)} distinct pieces")
    vocab = train(counts, n_bpe)
    os.makedirs(model_dir, exist_ok=True)
    write_tiktoken(os.path.join(model_dir, "tiktoken.model"), vocab)
    write_tokenizer_config(os.path.join(model_dir, "tokenizer_config.json"), n_bpe)
    print(f"wrote {n_bpe} ranks + {SPECIAL_SLOTS} special slots; last merges:",
          [t.decode(errors="replace") for t in vocab[-5:]])


def cmd_encode(data_dir, model_dir):
    ranks = read_tiktoken(os.path.join(model_dir, "tiktoken.model"))
    bos = len(ranks)
    enc = Encoder(ranks)
    for split in ("train", "valid", "test"):
        ids, nbytes = [], []
        for doc in read_docs(os.path.join(data_dir, split + ".jsonl")):
            ids.append(bos)
            ids.extend(enc.encode(doc))
            nbytes.append(len(doc.encode()))
        with open(os.path.join(data_dir, split + ".ids"), "wb") as f:
            f.write(struct.pack(f"<{len(ids)}H", *ids))
        with open(os.path.join(data_dir, split + ".bytes.json"), "w") as f:
            json.dump({"docs": len(nbytes), "bytes": sum(nbytes), "tokens": len(ids)}, f)
        print(f"{split}: {len(ids)} tokens for {sum(nbytes)} bytes ({sum(nbytes) / len(ids):.2f} bytes/token)")


def main():
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == "train":
        cmd_train(a[1], a[2], int(a[3]) if len(a) > 3 else 5888)
    elif len(a) == 3 and a[0] == "encode":
        cmd_encode(a[1], a[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

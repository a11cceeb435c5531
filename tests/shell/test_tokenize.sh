#!/usr/bin/env bash
# test_tokenize.sh — `deltafin tokenize/detokenize` against ids from the real tiktoken (tools/tok_ref.js, npm
# tiktoken) on cl100k_base and o200k_base with their own patterns and with the Kimi pattern; invalid UTF-8,
# round trips, model folders and errors.
set -u
cd "$(dirname "$0")/../.."
DF=${DF:-build/asan/deltafin}
[ -x "$DF" ] || DF=./deltafin
T=tests/tokenizer
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { echo "ok - $1"; }
bad() { echo "not ok - $1"; }
check() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: got '$2' want '$3'"; fi; }

for v in cl100k_base o200k_base; do gzip -dc "$T/$v.tiktoken.gz" >"$tmp/$v.tiktoken"; done
cp models/default/tiktoken.model "$tmp/default.tiktoken"     # the bundled model's own vocabulary

for exp in "$T"/expected/*.jsonl; do
    name=$(basename "$exp" .jsonl)           # VOCAB-PATTERN[-special].CORPUS
    corpus=${name##*.}
    spec=${name%.*}
    vocab=${spec%%-*}
    rest=${spec#*-}
    pat=${rest%-special}
    flag=
    [ "$rest" != "$pat" ] && flag=--special
    "$DF" tokenize --tiktoken "$tmp/$vocab.tiktoken" --pattern "$pat" $flag --jsonl "$T/$corpus.jsonl" >"$tmp/got" 2>"$tmp/err"
    rc=$?
    n=$(wc -l <"$exp")
    if [ $rc -eq 0 ] && cmp -s "$tmp/got" "$exp"; then
        ok "$name: $n strings, ids equal to tiktoken"
    else
        line=$(diff "$tmp/got" "$exp" | head -1)
        bad "$name (rc $rc): first difference at $line $(head -c 300 "$tmp/err")"
    fi
done

CL="$DF tokenize --tiktoken $tmp/cl100k_base.tiktoken --pattern cl100k"
DCL="$DF detokenize --tiktoken $tmp/cl100k_base.tiktoken --pattern cl100k"

# --text and --file agree with the reference corpus line for the same string
check "--text matches corpus" "$($CL --text 'Hello, world!')" "$(sed -n 2p "$T/expected/cl100k_base-cl100k.hard_strings.jsonl")"
check "specials are text unless --special" "$($CL --text '<|endoftext|>' | tr -d '\n')" "[27,91,8862,728,428,91,29]"
check "--special recognises <|endoftext|>" "$($CL --special --text 'a<|endoftext|>')" "[64,100257]"

# round trip of arbitrary bytes, invalid UTF-8 included
cp "$T/hard_strings.jsonl" "$tmp/rt"
printf 'hello\xff world \xe4\xb8 cut \xc0\xaf overlong \xed\xa0\x80 surrogate \xf8\x88 \x80\n' >>"$tmp/rt"
$CL --file "$tmp/rt" >"$tmp/rt.ids" && $DCL <"$tmp/rt.ids" >"$tmp/rt.back"
if cmp -s "$tmp/rt" "$tmp/rt.back"; then ok "detokenize(tokenize(bytes)) == bytes, invalid UTF-8 included"; else bad "round trip"; fi

# invalid UTF-8: each bad byte is its own piece; the valid runs on either side are encoded on their own
printf 'hello\xff world' >"$tmp/inv"
a=$($CL --text hello | tr -d '[]\n'); b=$($CL --text ' world' | tr -d '[]\n')
ff=$($CL --file "$tmp/inv" | tr -d '[]\n' | cut -d, -f2)
check "invalid byte splits the text" "$($CL --file "$tmp/inv")" "[$a,$ff,$b]"
check "the invalid byte's token is that byte" "$($DCL --ids "[$ff]" | od -An -tx1 | tr -d ' \n')" "ff"

# model folders: Kimi pattern, specials from tokenizer_config.json, reserved names
K3="$DF tokenize -m $T/tiny_k3"
check "-m: <|open|> is special when allowed" "$($K3 --special --text '<|open|>axx')" "[260,97,256]"
check "-m: not allowed: bytes" "$($K3 --text '<|sep|>' | tr -d '\n')" "[60,124,115,101,112,124,62]"
check "-m: reserved token name" "$($K3 --special --text '<|reserved_token_300|>')" "[300]"
check "-m: detokenize special" "$($DF detokenize -m $T/tiny_k3 --ids '[260,97,256,259]')" "<|open|>axx<|end_of_msg|>"

# errors are reported, not crashed on
$DF detokenize -m $T/tiny_k3 --ids '[99999]' >/dev/null 2>"$tmp/e"; rc=$?
if [ $rc -ne 0 ] && grep -q 'not in the vocabulary' "$tmp/e"; then ok "unknown id is an error"; else bad "unknown id: rc $rc"; fi
$DF detokenize -m $T/tiny_k3 --ids '[1,"a"]' >/dev/null 2>"$tmp/e"; rc=$?
if [ $rc -ne 0 ] && grep -q 'not a token id' "$tmp/e"; then ok "bad ids JSON is an error"; else bad "bad ids JSON: rc $rc"; fi
printf 'IQ== 0\nnot-base64 1\n' >"$tmp/bad.tiktoken"
$DF tokenize --tiktoken "$tmp/bad.tiktoken" --text x >/dev/null 2>"$tmp/e"; rc=$?
if [ $rc -ne 0 ] && grep -q 'bad.tiktoken:2' "$tmp/e"; then ok "malformed rank file names the line"; else bad "malformed rank file: rc $rc $(cat "$tmp/e")"; fi
$DF tokenize -m "$tmp/nowhere" --text x >/dev/null 2>"$tmp/e"; rc=$?
if [ $rc -ne 0 ] && grep -q 'tiktoken.model' "$tmp/e"; then ok "missing model folder is an error"; else bad "missing folder: rc $rc"; fi
$DF tokenize --tiktoken "$tmp/cl100k_base.tiktoken" --pattern '(' --text x >/dev/null 2>"$tmp/e"; rc=$?
if [ $rc -ne 0 ] && grep -q 'regex' "$tmp/e"; then ok "bad regex is an error"; else bad "bad regex: rc $rc"; fi

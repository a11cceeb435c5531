#!/usr/bin/env bash
# test_state_hostile.sh — the CLI and the server on a bundled-model folder whose state is hostile, end to end
# (ASan build): a FIFO as the heat file, FIFOs, a symlink and a crafted token file in the prompt cache folder,
# and config.json values that would make the numbers meaningless. Every case finishes by itself (no hang: each
# command runs under a timeout), answers or refuses clearly, and the server still listens, answers /props and
# stops on SIGTERM.
set -u
cd "$(dirname "$0")/../.."
bin=build/asan/deltafin
[ -x "$bin" ] || bin=./deltafin
dir=$(mktemp -d /tmp/df_hostile_XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
ok() { echo "ok - $*"; }
bad() { echo "not ok - $*"; }
m=$dir/m
mkdir -p "$m/.deltafin"
for f in models/default/*; do ln -s "$PWD/$f" "$m/"; done

# a FIFO heat file: run goes on without the heat, saying so
mkfifo "$m/.deltafin/heat"
if timeout 120 $bin run -m "$m" -p "The" -n 2 --heat on >"$dir/out" 2>"$dir/err"; then
    grep -q "heat.*ignored" "$dir/err" && ok "run with a FIFO heat file finishes and says the heat was ignored" ||
        ok "run with a FIFO heat file finishes"
else
    bad "run with a FIFO heat file: exit $? ($(tail -2 "$dir/err"))"
fi
rm -f "$m/.deltafin/heat"

# the prompt cache folder: FIFOs under its names, a symlink, and the token file whose count wraps a length
# check (2^62 + 1 tokens in 4 bytes)
kv=$dir/kv
mkdir "$kv"
mkfifo "$kv/00000000000000aa-3.tok" "$kv/00000000000000ab-3.kv" "$kv/.00000000000000ac-3.tok.tmp-qwerty"
echo state >"$kv/00000000000000aa-3.kv"
ln -s /etc/hostname "$kv/00000000000000ad-4.tok"
python3 -c "
import struct
n=(1<<62)+1
for magic in (0x54504644, 0x32504644):
    open('$kv/%016x-%d.tok' % (magic, n), 'wb').write(struct.pack('<IQQ', magic, n, magic) + b'\0' * 12)
    open('$kv/%016x-%d.kv' % (magic, n), 'wb').write(b'state')
"
$bin serve -m "$m" --host 127.0.0.1 --port 0 --threads 1 --prompt-cache "$kv" 2>"$dir/serve.log" &
pid=$!
url=
for _ in $(seq 1 600); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$dir/serve.log" | head -n 1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [ -n "$url" ]; then
    ok "serve listens with FIFOs, a symlink and wrapping token files in its prompt cache folder"
    props=$(timeout 20 curl -s "$url/props")
    echo "$props" | grep -q '"prompt_cache"' && ok "/props answers: $(echo "$props" | grep -o '"prompt_cache":{[^}]*}')" ||
        bad "/props: $props"
    r=$(timeout 120 curl -s "$url/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"The old man","max_tokens":3,"temperature":0}')
    echo "$r" | grep -q '"text"' && ok "a completion is answered" || bad "completion: $r"
    kill -TERM "$pid"
    rc=0
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        bad "serve ignored SIGTERM"
    else
        wait "$pid" || rc=$?
        [ "$rc" = 0 ] && ! grep -q Sanitizer "$dir/serve.log" && ok "serve stops on SIGTERM (exit 0, no sanitizer report)" ||
            bad "serve exited $rc: $(tail -5 "$dir/serve.log")"
    fi
    pid=
    left=$(find "$kv" -mindepth 1 \( ! -type f -o -name '*.tok' \) | wc -l)
    [ "$left" = 0 ] && echo "$props" | grep -q '"bytes":16' &&
        ok "the FIFOs, the symlink and the damaged token files were dropped, their states counted as orphans" ||
        bad "left in the cache folder: $(ls -A "$kv" | tr '\n' ' ')"
else
    bad "serve did not listen: $(tail -5 "$dir/serve.log")"
fi

# config values that would make the numbers meaningless: refused naming the key, never NaN logits with exit 0
c=$dir/c
mkdir "$c"
for f in models/default/*; do [ "${f##*/}" = config.json ] || ln -s "$PWD/$f" "$c/"; done
n_bad=0 n=0
for kv_pair in rms_norm_eps=0 rms_norm_eps=-1e-6 rms_norm_eps=1e30 rms_norm_eps=1e-85 routed_scaling_factor=0 routed_scaling_factor=1e30 \
               routed_scaling_factor=-2 model_max_length=0 activation_situ_beta=0; do
    key=${kv_pair%%=*} val=${kv_pair#*=}
    python3 -c "
import json
d = json.load(open('models/default/config.json'))
t = d.get('text_config', d)
t['$key'] = json.loads('$val')
json.dump(d, open('$c/config.json', 'w'))"
    n=$((n + 1))
    if timeout 120 $bin run -m "$c" -p "The" -n 2 >"$dir/out" 2>"$dir/err"; then
        bad "$key=$val accepted"; n_bad=$((n_bad + 1))
    elif ! grep -q "$key" "$dir/err"; then
        bad "$key=$val refused without naming it: $(head -c 200 "$dir/err")"; n_bad=$((n_bad + 1))
    fi
done
[ "$n_bad" = 0 ] && ok "$n meaningless config values refused at open, naming the key" ||
    bad "$n_bad of $n meaningless config values not refused clearly"

#!/usr/bin/env bash
# test_public_lib.sh — the library `make install` ships: its archive exports exactly the functions
# include/deltafin.h marks DF_API (every one df_*, internals hidden), and a C program using only the installed
# header and pkg-config file links against it and decodes greedily what transformers decoded on the bundled
# model (models/default/reference.json); a program calling an internal function does not link.
set -u
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CC=${CC:-cc}
inst=$tmp/inst
if ! make -s --no-print-directory install PREFIX="$inst" >"$tmp/install.log" 2>&1; then
    echo "not ok - make install PREFIX=...: $(tail -c 300 "$tmp/install.log")"
    exit 1
fi
for f in include/deltafin.h lib/libdeltafin.a lib/pkgconfig/deltafin.pc bin/deltafin; do
    [ -f "$inst/$f" ] && echo "ok - make install ships $f" || echo "not ok - make install did not ship $f"
done

# The API the header declares: every function declaration marked DF_API.
sed -n 's/^DF_API .*\<\(df_[a-z0-9_]*\)(.*/\1/p' include/deltafin.h | sort >"$tmp/api"
n_api=$(wc -l <"$tmp/api")
[ "$n_api" -ge 30 ] && echo "ok - include/deltafin.h marks $n_api functions DF_API" \
    || echo "not ok - only $n_api DF_API functions found in include/deltafin.h"
hint="(objects compiled before the library was built with -fvisibility=hidden? make clean, then make)"
check_exports() {   # what, file, nm options
    local what=$1 file=$2; shift 2
    nm -g --defined-only "$@" "$file" | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/exp"
    local other
    other=$(grep -v '^df_' "$tmp/exp" | head -n 8 | tr '\n' ' ')
    [ -z "$other" ] && echo "ok - $what exports only df_* symbols" \
        || echo "not ok - $what exports $(grep -cv '^df_' "$tmp/exp") symbols outside df_*: $other $hint"
    if cmp -s "$tmp/exp" "$tmp/api"; then
        echo "ok - $what exports exactly the $n_api DF_API functions of the header"
    else
        echo "not ok - $what exports differ from the header's DF_API functions: $(diff "$tmp/api" "$tmp/exp" |
            grep '^[<>]' | head -n 8 | tr '\n' ' ') $hint"
    fi
}
check_exports "the installed libdeltafin.a" "$inst/lib/libdeltafin.a"
[ -e "$inst/lib/libdeltafin.so" ] && check_exports "the installed libdeltafin.so" "$inst/lib/libdeltafin.so" -D

export PKG_CONFIG_PATH=$inst/lib/pkgconfig
if ! flags=$(pkg-config --cflags --libs deltafin 2>"$tmp/pc.err"); then
    echo "not ok - pkg-config deltafin: $(head -c 300 "$tmp/pc.err")"
    exit 1
fi
echo "ok - pkg-config finds the installed deltafin.pc (version $(pkg-config --modversion deltafin))"
# shellcheck disable=SC2086
if $CC -std=c11 -Wall -Wextra -Werror -pedantic -o "$tmp/greedy" tests/shell/public_api_greedy.c $flags \
    >"$tmp/cc.log" 2>&1; then
    echo "ok - a program using only <deltafin.h> compiles and links against the installed archive"
    prompt=$(python3 -c "import json; print(','.join(map(str, json.load(open('models/default/reference.json'))['cases'][0]['prompt_ids'])))")
    want=$(python3 -c "import json; print(','.join(map(str, json.load(open('models/default/reference.json'))['cases'][0]['greedy'][:8])))")
    got=$("$tmp/greedy" models/default "$prompt" 8 2>"$tmp/run.err")
    [ -n "$want" ] && [ "$got" = "$want" ] \
        && echo "ok - it decodes greedily what transformers did on models/default ($got)" \
        || echo "not ok - greedy ids through the installed library: got '$got' want '$want' $(head -c 300 "$tmp/run.err")"
else
    echo "not ok - the public-API program does not build against the installed archive: $(head -c 600 "$tmp/cc.log")"
fi

if command -v c++ >/dev/null; then
    # shellcheck disable=SC2086
    printf '#include <deltafin.h>\nint main() { df_engine_opts o; df_engine_opts_default(&o); return o.n_threads; }\n' |
        c++ -Wall -Wextra -Werror -x c++ -o "$tmp/cxx" - $flags >"$tmp/cxx.log" 2>&1 && "$tmp/cxx" \
        && echo "ok - a C++ program includes <deltafin.h> and links against the installed archive" \
        || echo "not ok - C++ use of the installed library: $(head -c 300 "$tmp/cxx.log")"
fi

# An internal function is not reachable from the installed archive, while the internal one still has it (so
# the link failure is the hiding, not a typo in the program).
cat >"$tmp/internal.c" <<'PROG'
#include <deltafin.h>
void df_error_set(df_error *err, int code, const char *fmt, ...);
int main(void) {
    df_error e;
    df_error_set(&e, DF_EINVAL, "x");
    return e.code == DF_EINVAL ? 0 : 1;
}
PROG
# shellcheck disable=SC2086
if $CC -std=c11 -o "$tmp/internal" "$tmp/internal.c" $flags >"$tmp/int.log" 2>&1; then
    echo "not ok - a program calling the internal df_error_set links against the installed archive"
elif grep -q "undefined reference to .df_error_set" "$tmp/int.log"; then
    echo "ok - the installed archive hides internal functions (df_error_set is an undefined reference)"
else
    echo "not ok - the internal-call program failed to build for another reason: $(head -c 300 "$tmp/int.log")"
fi
# shellcheck disable=SC2086
$CC -std=c11 -Iinclude -o "$tmp/internal" "$tmp/internal.c" build/libdeltafin.a $(pkg-config --libs deltafin |
    sed 's/-ldeltafin//') >"$tmp/int2.log" 2>&1 && "$tmp/internal" \
    && echo "ok - the same program links against the internal build/libdeltafin.a (control)" \
    || echo "not ok - control: the internal archive lacks df_error_set: $(head -c 300 "$tmp/int2.log")"

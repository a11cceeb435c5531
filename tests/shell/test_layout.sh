#!/usr/bin/env bash
# The source layout as the rooms promise it (src/ROOMS): every folder of src/ is a listed room with a README.md,
# every file opens with a comment, no room holds more than 5,000 lines of .c/.h and no file more than 800, and
# every quoted include names an existing header of the file's own room, of a room listed before it in src/ROOMS,
# or the public header. A failing check names the file and the include or count at fault.
set -u
cd "$(dirname "$0")/../.."
MAX_ROOM=${LAYOUT_MAX_ROOM:-5000}
MAX_FILE=${LAYOUT_MAX_FILE:-800}
layout_check() (   # root folder: prints the ok/not ok lines for that tree
    cd "$1" || exit 1
    order=$(grep -vE '^[[:space:]]*(#|$)' src/ROOMS | awk '{print $1}')
    local -A ranks=()
    local i=0 name
    for name in $order; do i=$((i + 1)); ranks[$name]=$i; done
    rank() { echo "${ranks[$1]:-}"; }

    bad=0
    for d in src/*/; do
        r=$(basename "$d")
        [ -n "$(rank "$r")" ] || { echo "# src/$r is not listed in src/ROOMS"; bad=1; }
        [ -f "$d/README.md" ] || { echo "# src/$r has no README.md saying what it owns"; bad=1; }
    done
    for r in $order; do [ -d "src/$r" ] || { echo "# src/ROOMS lists '$r', which is not a folder of src/"; bad=1; }; done
    [ $bad -eq 0 ] && echo "ok - every folder of src/ is a room listed in src/ROOMS with a README.md" \
        || echo "not ok - rooms and src/ROOMS disagree"

    # One pass of awk over every file: its first line, its length and its quoted includes.
    local facts
    facts=$(awk 'FNR == 1 { if (NR > 1) print "LINES", prev, n; prev = FILENAME; if ($0 !~ /^\/\* /) print "NOHEAD", FILENAME }
                 { n = FNR }
                 /^[[:space:]]*#[[:space:]]*include[[:space:]]*"/ { s = $0; sub(/^[^"]*"/, "", s); sub(/".*/, "", s)
                                                                    print "INC", FILENAME, s }
                 END { print "LINES", prev, n }' src/*/*.[ch] include/*.h)

    bad=0
    while read -r _ f; do echo "# $f does not open with a comment saying what it owns"; bad=1; done < <(grep '^NOHEAD ' <<<"$facts")
    [ $bad -eq 0 ] && echo "ok - every source file opens with a comment" || echo "not ok - files without an opening comment"

    bad=0
    local -A room_lines=()
    local big=0
    while read -r _ f n; do
        [ "$n" -le "$MAX_FILE" ] || { echo "# $f has $n lines (at most $MAX_FILE)"; big=1; }
        case $f in src/*) r=${f#src/}; r=${r%%/*}; room_lines[$r]=$(( ${room_lines[$r]:-0} + n )) ;; esac
    done < <(grep '^LINES ' <<<"$facts")
    for r in "${!room_lines[@]}"; do
        [ "${room_lines[$r]}" -le "$MAX_ROOM" ] || { echo "# src/$r holds ${room_lines[$r]} lines of .c/.h (at most $MAX_ROOM)"; bad=1; }
    done
    [ $bad -eq 0 ] && echo "ok - no room over $MAX_ROOM lines" || echo "not ok - a room over $MAX_ROOM lines"
    [ $big -eq 0 ] && echo "ok - no file over $MAX_FILE lines" || echo "not ok - a file over $MAX_FILE lines"

    # Every quoted include resolved as the compiler would (-Iinclude -Isrc, the file's own folder first).
    bad=0 edges=0
    while read -r _ f inc; do
        case $f in src/*) ;; *) continue ;; esac
        local fd=${f%/*}
        r=${fd#src/}
        own=${ranks[$r]:-0}
        case $inc in *.inc) continue ;; esac   # generated into the build folder (the GPU kernels' source text)
        if [ -f "$fd/$inc" ]; then
            case $inc in *..*) t=$(realpath --relative-to=src "$fd/$inc") ;; *) t=$r/$inc ;; esac
        elif [ -f "src/$inc" ]; then t=$inc
        elif [ -f "include/$inc" ]; then continue
        else echo "# $f includes \"$inc\", which names no header"; bad=1; continue; fi
        case $t in */*) ;; *) echo "# $f includes \"$inc\", outside every room"; bad=1; continue ;; esac
        tr=${t%%/*}
        [ "$tr" = "$r" ] && continue
        edges=$((edges + 1))
        tk=${ranks[$tr]:-}
        if [ -z "$tk" ]; then echo "# $f includes \"$inc\" of '$tr', a folder not listed in src/ROOMS"; bad=1
        elif [ "$tk" -gt "$own" ]; then echo "# $f ($r) includes \"$inc\" of $tr, which src/ROOMS lists after it"; bad=1
        fi
    done < <(grep '^INC ' <<<"$facts")
    [ $bad -eq 0 ] && echo "ok - $edges includes between rooms all run downward (src/ROOMS)" \
        || echo "not ok - includes that run upward or name no header"
)

layout_check . | sed 's/^ok - /ok - layout: /; s/^not ok - /not ok - layout: /'

# The checker itself must catch what it is there to catch: a copy of the tree with an upward include, a
# too-long file, a folder without README.md and an include of a missing header.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r src include "$tmp/"
echo '#include "server/server.h"' >>"$tmp/src/format/safetensors.c"
echo '#include "format/no_such.h"' >>"$tmp/src/io/io.c"
seq 1 900 | sed 's|^|// |' >>"$tmp/src/common/hash.c"
rm -f "$tmp/src/install/README.md"
out=$(layout_check "$tmp")
expect() {   # name, pattern
    if grep -q -- "$2" <<<"$out"; then echo "ok - layout checker catches $1"
    else echo "not ok - layout checker misses $1: $(head -c 600 <<<"$out")"; fi
}
expect "an upward include" 'src/format/safetensors.c (format) includes "server/server.h" of server'
expect "an include of a missing header" 'src/io/io.c includes "format/no_such.h", which names no header'
expect "a file over the limit" "src/common/hash.c has [0-9]* lines (at most $MAX_FILE)"
expect "a room without README.md" 'src/install has no README.md'
out=$(MAX_ROOM=1000 layout_check "$tmp")
expect "a room over the limit" "src/common holds [0-9]* lines of .c/.h (at most 1000)"

# The pictures of docs/ARCHITECTURE.md are drawn from the code: both must be what tools/room_graph.js draws now.
if command -v node >/dev/null 2>&1; then
    node tools/room_graph.js --svg "$tmp/rooms.svg"
    cmp -s "$tmp/rooms.svg" docs/rooms.svg && echo "ok - layout: docs/rooms.svg is today's include graph" ||
        echo "not ok - layout: docs/rooms.svg is out of date (node tools/room_graph.js --svg docs/rooms.svg)"
    node tools/room_graph.js --mermaid >"$tmp/rooms.mmd"
    sed -n '/<!-- rooms:begin -->/,/<!-- rooms:end -->/p' docs/ARCHITECTURE.md | sed '1s/.*<!-- rooms:begin -->//;$s/<!-- rooms:end -->.*//' |
        sed '/^$/d' >"$tmp/doc.mmd"
    cmp -s "$tmp/rooms.mmd" "$tmp/doc.mmd" && echo "ok - layout: docs/ARCHITECTURE.md's mermaid graph is today's" ||
        echo "not ok - layout: the mermaid graph in docs/ARCHITECTURE.md is out of date (node tools/room_graph.js --mermaid)"
else
    echo "skip - layout: the include graph pictures (no node)"
fi

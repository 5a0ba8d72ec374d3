#!/usr/bin/env bash
# A short GRPO job on the GPU with randomly initialised models (SmolLM2-135M's shape and
# a ~0.5B Qwen2's), printing step times and tokens/s. Needs only python3 with torch,
# transformers, tokenizers and peft (no project virtualenv, no weights, no network).
# Arguments pass through: `--device cpu --tiny` runs the same code anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
exec "$PYTHON" scripts/gpu_check.py "$@"

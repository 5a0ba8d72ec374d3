#!/usr/bin/env bash
# A short GRPO job on the GPU with randomly initialised models (SmolLM2-135M's shape and
# a ~0.5B Qwen2's), printing step times and tokens/s, then the sampler's two decode loops.
# Needs only python3 with torch, transformers, tokenizers and peft (no project virtualenv,
# no weights, no network). Arguments pass through: `--device cpu --tiny` runs the same
# code anywhere. On a GPU where TRL is installed (requirements-bench.txt), our GRPO step
# then runs side by side with TRL's GRPOTrainer on the same settings, for both shapes; where
# vLLM is installed, the job runs again with a colocated vLLM engine (`rollout: colocate`).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" scripts/gpu_check.py "$@"
case " $* " in
  *" --device cpu "* | *" --sampler-only "* | *" --help "* | *" -h "* | *" --colocate "*) exit 0 ;;
esac
if "$PYTHON" -c "import vllm" 2>/dev/null; then
  # The same job with the vLLM engine in the job (asleep while it trains) instead of a server.
  "$PYTHON" scripts/gpu_check.py --colocate --no-sampler "$@"
else
  echo "vLLM is not installed here: pip install vllm for the vLLM rollouts (server and colocated)"
fi
if "$PYTHON" -c "import trl, datasets" 2>/dev/null; then
  for shape in smollm2-135m qwen2-0.5b; do
    "$PYTHON" bench/grpo_vs_trl.py --device cuda --shape "$shape" --steps 12 --block 4
  done
else
  echo "TRL is not installed here: pip install trl==1.16.0 for the side-by-side with TRL's GRPOTrainer"
  echo "(bench/grpo_vs_trl.py --device cuda --shape smollm2-135m)"
fi

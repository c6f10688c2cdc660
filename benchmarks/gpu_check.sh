#!/usr/bin/env bash
# The checks that need a GPU, in one go (under 8 minutes on a lent CUDA machine), so that a
# machine with a GPU is used at once whenever one is available:
#   1. the `gpu`-marked tests (CUDA memory counters, bf16/fp16, CUDA RNG in checkpoints,
#      CUDA_VISIBLE_DEVICES pinning),
#   2. the loop-overhead benchmark on CUDA (our loop with full ledger recording against a
#      bare PyTorch loop; ratios of medians),
#   3. with two CUDA devices or more: a sharded run (FSDP2 over NCCL) against a bare FSDP2
#      script and against replicate (benchmarks/sharded.py).
# Usage: benchmarks/gpu_check.sh   (from the repository root; creates .venv-gpu when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-gpu}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip -q install --upgrade pip
    # a CUDA build of torch (the machine's pip configuration says which one lies on its disk)
    "$VENV/bin/python" -m pip -q install "torch>=2.6,<3"
    "$VENV/bin/python" -m pip -q install -e ".[test]"
fi
"$VENV/bin/python" - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device visible: nothing to check here"
print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))
PY
echo "== gpu-marked tests"
timeout 300 "$VENV/bin/python" -m pytest -q -n 0 -m gpu tests/ --durations=10
echo "== loop overhead on CUDA"
timeout 150 "$VENV/bin/python" benchmarks/overhead.py --device cuda --steps 300 --rounds 3
echo "== sharded runs (FSDP2, NCCL) against a bare FSDP2 script and replicate"
if [ "$("$VENV/bin/python" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    timeout 300 "$VENV/bin/python" benchmarks/sharded.py --device cuda --ranks 2 --updates 40 --rounds 1
else
    echo "one CUDA device: a sharded run needs one per rank; skipped"
fi

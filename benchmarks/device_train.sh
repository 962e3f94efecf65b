#!/usr/bin/env bash
# The training benchmarks on one GPU, as one short script (about 10 minutes on an H100/H200):
#
#   1. the fine-tuning step of train_step.py (ViT-B/16 at 224, batch 8, mixed bfloat16) with
#      keras_vit's ops.dot_product_attention forced to its flash path and off, beside timm and
#      Flax on the same device;
#   2. ViT-L/16 at 384 (batch 4), mixed bfloat16, with and without remat=True: images/s and the
#      device's peak memory (JAX: memory_stats()["peak_bytes_in_use"], torch:
#      max_memory_allocated), keras_vit on JAX beside Flax with nn.remat.
#
# Usage (from the repository root, with .venv ready and a CUDA build of jax/torch):
#   bash benchmarks/device_train.sh [OUT_DIR]
# Results: OUT_DIR/device_train_flash.{json,md}, OUT_DIR/device_train_remat.{json,md}
# (default OUT_DIR: benchmarks/results).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import jax; print('jax devices:', jax.devices())" || true

# 1. flash attention on/off (keras_vit sides), peers once; 1 round, 5 timed steps.
"$PY" benchmarks/train_step.py --device gpu --models B16 --dtypes mixed_bfloat16 \
    --sides keras-jax keras-torch timm flax --torch-jit eager --flash on off \
    --rounds 1 --steps 5 --warmup 2 --timeout 240 --name device_train_flash
# 2. ViT-L/16 at 384: remat off/on.
"$PY" benchmarks/train_step.py --device gpu --models L16_384 --dtypes mixed_bfloat16 \
    --sides keras-jax flax --remat off on \
    --rounds 1 --steps 5 --warmup 2 --timeout 240 --name device_train_remat
cp benchmarks/results/device_train_flash.* benchmarks/results/device_train_remat.* "$OUT"/ 2>/dev/null || true

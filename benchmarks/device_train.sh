#!/usr/bin/env bash
# The GPU benchmarks as one short script (about 8 minutes on an H200 with the defaults):
#
#   0. the inference roofline (device_roofline.py): ViT-B/16 inference of keras_vit on JAX and on
#      PyTorch (eager and compiled) beside timm (eager and compiled), each against the same process's
#      matmul rate on ViT-B/16's shapes, bfloat16 then float32;
#   1. the fine-tuning step of train_step.py (ViT-B/16 at 224, mixed bfloat16) with keras_vit's
#      ops.dot_product_attention forced to its flash path and off, beside timm and Flax;
#   2. ViT-L/16 at 384 (batch 4), mixed bfloat16, with and without remat=True: images/s and the
#      device's peak memory (JAX: memory_stats()["peak_bytes_in_use"]), keras_vit on JAX beside Flax
#      with nn.remat.
#
# Usage (from the repository root, with a CUDA build of jax/torch, keras, timm and flax importable):
#   bash benchmarks/device_train.sh [OUT_DIR]
# Knobs (environment): PARTS (default "roofline flash remat"), PYTHON (default .venv/bin/python),
# BATCH (ViT-B/16's batch for parts 0 and 1; default 64 and 32), SIDES (part 1's sides, default
# "keras-jax keras-torch timm flax"), BUDGET (seconds part 0 may start sides in; default 240).
# Results: OUT_DIR/device_roofline.{json,md}, OUT_DIR/device_train_flash.{json,md},
# OUT_DIR/device_train_remat.{json,md} (default OUT_DIR: benchmarks/results), each written as it goes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results}
PY=${PYTHON:-.venv/bin/python}
PARTS=${PARTS:-roofline flash remat}
SIDES=${SIDES:-keras-jax keras-torch timm flax}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import jax; print('jax devices:', jax.devices())" || true
copy() { cp benchmarks/results/device_train_*.json benchmarks/results/device_train_*.md "$OUT"/ 2>/dev/null || true; }
trap copy EXIT

case " $PARTS " in *" roofline "*)
  "$PY" benchmarks/device_roofline.py --out "$OUT" --batch "${BATCH:-64}" --budget "${BUDGET:-240}" --timeout 150
esac
case " $PARTS " in *" flash "*)
  # shellcheck disable=SC2086
  "$PY" benchmarks/train_step.py --device gpu --models B16 --batch "${BATCH:-32}" --dtypes mixed_bfloat16 \
      --sides $SIDES --torch-jit eager --flash on off \
      --rounds 1 --steps 5 --warmup 2 --timeout 150 --name device_train_flash
esac
case " $PARTS " in *" remat "*)
  "$PY" benchmarks/train_step.py --device gpu --models L16_384 --dtypes mixed_bfloat16 \
      --sides keras-jax flax --remat off on \
      --rounds 1 --steps 5 --warmup 2 --timeout 150 --name device_train_remat
esac

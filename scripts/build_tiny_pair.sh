#!/usr/bin/env bash
# Rebuild the embedded tiny pair shipped in dflash_trt/assets/tiny/ from scratch.
#
#   scripts/build_tiny_pair.sh            # about 30 minutes on 2 CPU threads (measured piecewise:
#                                         # target 5.5, regeneration 12, feature cache 3, drafter 8)
#
# 1. scripts/train_tiny_target.py: byte-level BPE tokenizer (4096 tokens, <|endoftext|>,
#    <|mask|>) and a 16-layer Qwen3 code model trained on this Python's Lib/*.py (sorted;
#    every 8th file held out), plus held-out prompts cut from the held-out files.
# 2. dflash-trt train-drafter: a 2-layer DFlash2 drafter (block 8, taps 1,7,13, selector rank 64,
#    top-k 8) on responses the target regenerates from prompts cut out of the training files.
#    DRAFTER_ARCH=dflash DRAFTER_LAYERS=3 DRAFTER_STEPS=8000 trains the DFlash drafter shipped before
#    it (bench τ 3.90 against 4.35).
# 3. Copy the weights, tokenizer and prompts into the package; bench the result.
#
# Reproducible up to seeds and torch's CPU kernels (SEED=0 by default). Work files go to
# $WORK (build/tiny); the package directory is replaced only once everything succeeded.
# REUSE_TARGET=1 skips step 1 when $WORK/target exists (to retrain only the drafter).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-build/tiny}
SEED=${SEED:-0}
# The shipped pair was trained with OMP_NUM_THREADS=2 on an otherwise idle 2-core machine;
# on a shared CPU one thread per process is faster.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PY=${PYTHON:-python}

if [ "${REUSE_TARGET:-0}" = 1 ] && [ -f "$WORK/target/config.json" ]; then
    echo "reusing $WORK/target (REUSE_TARGET=1)"
else
    $PY scripts/train_tiny_target.py --out "$WORK/target" --work "$WORK" --seed "$SEED" --threads "$OMP_NUM_THREADS" --layers 16
fi

rm -rf "$WORK/drafter" "$WORK/features"
# Windows every 96 tokens (not every prompt + response, 192): twice the prompts from the same
# files (11,544 sequences); the target's hidden states are cached once in $WORK/features, so a step runs
# the drafter alone.
ARCH=${DRAFTER_ARCH:-dflash2}
SIZES=(); [ "$ARCH" = dflash2 ] && SIZES=(--selector-rank 64 --selector-top-k 8)
$PY -m dflash_trt train-drafter --target "$WORK/target" --data "$WORK/train_files" --out "$WORK/drafter" \
    --arch "$ARCH" "${SIZES[@]}" \
    --block-size 8 --layers "${DRAFTER_LAYERS:-2}" --target-layer-ids 1,7,13 --steps "${DRAFTER_STEPS:-3000}" \
    --batch-size 8 --anchors 16 --lr 2e-3 --prompt-len 64 --gen-len 128 --window-stride 96 --samples 16384 \
    --feature-cache "$WORK/features" --eval-every 500 --save-every 500 --seed "$SEED" \
    --json > "$WORK/drafter_train.json"

ASSETS=dflash_trt/assets/tiny
rm -rf "$ASSETS.tmp"
mkdir -p "$ASSETS.tmp/target" "$ASSETS.tmp/drafter"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json training.json; do
    cp "$WORK/target/$f" "$ASSETS.tmp/target/"
done
cp "$WORK/drafter/config.json" "$WORK/drafter/model.safetensors" "$ASSETS.tmp/drafter/"
$PY - "$WORK" "$ASSETS.tmp/drafter/training.json" <<'PYEOF'
import json, sys
work, dest = sys.argv[1], sys.argv[2]
settings = json.load(open(f"{work}/drafter/.train/settings.json"))
result = json.load(open(f"{work}/drafter_train.json"))
settings.update(target="embedded:tiny/target", data="Lib/*.py training split (see ../target/training.json)", out=None,
                feature_cache=None)
settings["steps"] = result["step"]
json.dump({"command": "scripts/build_tiny_pair.sh", "settings": settings, "result": result}, open(dest, "w"), indent=2)
PYEOF
cp "$WORK/heldout_prompts.jsonl" "$ASSETS.tmp/"
chmod -R a+rX,go-w "$ASSETS.tmp"
rm -rf "$ASSETS"
mv "$ASSETS.tmp" "$ASSETS"
du -sh "$ASSETS"

# Held-out standard-library prompts, greedy, block 8, DFlash against autoregressive.
$PY -m dflash_trt bench --json | tee "$WORK/bench.json"

#!/usr/bin/env bash
# Bundle-build checks CI runs on the CPU (no GPU, no network):
#   1. every bundled recipe whose shipped configs are complete plans from them (plan + build
#      --dry-run); every one whose configs lack fields (hub-only) refuses an offline plan in one line,
#      and a Hopper recipe plans for every TensorRT-LLM release the project knows;
#   2. the tiny recipe builds at bf16, fp8 and nvfp4 (ModelOpt calibrates on the CPU) and each
#      bundle is checked (deploy.check_trtllm_bundle): layout, manifest, trtllm config against the
#      schema, serve.sh, quantized tensors' dtypes and shapes.
# Exits non-zero on the first failure. Usage: ci/build_tiny.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
DT="python -m dflash_trt"

# Recipes by what their configs allow (plan.recipe_status / plan.lacking): every recipe whose shipped
# configs are complete plans and dry-runs offline; every one whose configs lack fields must refuse an
# offline plan in one line (an empty HF cache, HF_HUB_OFFLINE=1) naming what is missing.
LIST="from dflash_trt import plan as R; import sys; want = sys.argv[1] == 'lacking'
rs = {n: R.load_recipe(n) for n in R.bundled_recipes()}
print(' '.join(n for n, r in rs.items() if bool(R.lacking(r, 'target') + R.lacking(r, 'drafter')) == want))"
for recipe in $(python -c "$LIST" complete); do
  echo "== plan $recipe"
  $DT plan "$recipe" --json > "$WORK/plan-$recipe.json"
  $DT build "$recipe" --dry-run > /dev/null
done
mkdir -p "$WORK/empty-hf-cache"
REFUSED=$(python -c "from dflash_trt import ingest, plan as R
print(' '.join(n for n in R.bundled_recipes() if ingest.refused_id(R.load_recipe(n).drafter.id)))")
for recipe in $(python -c "$LIST" lacking); do   # hub-only offline: refused in one line, exit 2
  echo "== plan $recipe (configs lack fields, offline: must refuse)"
  code=0; HF_HUB_OFFLINE=1 HF_HUB_CACHE="$WORK/empty-hf-cache" $DT plan "$recipe" 2> "$WORK/refuse-$recipe.txt" > /dev/null || code=$?
  # a drafter the project refuses by name (ingest.refused_id: GGUF-only, a Gemma-4 backbone) is refused first, by name
  why="shipped configs lack"; case " $REFUSED " in *" $recipe "*) why="$(python -c "from dflash_trt import plan as R
print(R.load_recipe('$recipe').drafter.id)"): ";; esac
  [ "$code" = 2 ] && [ "$(wc -l < "$WORK/refuse-$recipe.txt")" -le 1 ] && grep -q "$why" "$WORK/refuse-$recipe.txt" \
    || { echo "error: recipe $recipe did not refuse offline in one line" >&2; cat "$WORK/refuse-$recipe.txt" >&2; exit 1; }
done

for release in $(python -c "from dflash_trt.plan import KNOWN_RELEASES as k; print(' '.join(k))"); do
  echo "== plan qwen3-8b-h100-fp8 for TensorRT-LLM $release"
  $DT build qwen3-8b-h100-fp8 --dry-run --set trtllm.release="$release" > /dev/null
done

python -c "import sys; from dflash_trt.plan import bundled_recipes; sys.exit('tiny' not in bundled_recipes())" \
  || { echo "error: no bundled tiny recipe (dflash_trt/recipes/tiny.yaml)" >&2; exit 1; }
for spec in "bf16 cpu" "fp8 h100" "nvfp4 b200"; do
  set -- $spec
  echo "== build tiny --precision $1 --gpu $2"
  $DT build tiny --precision "$1" --gpu "$2" -o "$WORK/tiny-$1" --force > /dev/null
  python -c "import sys, json; from dflash_trt.deploy import check_trtllm_bundle; print(json.dumps(check_trtllm_bundle(sys.argv[1])))" "$WORK/tiny-$1"
done
echo "ci/build_tiny.sh: ok ($WORK)"

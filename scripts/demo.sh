#!/usr/bin/env bash
# The main job on the embedded sample: generate it, build the corpus with the
# ALIGN preset (filters, decontamination against the sample's evaluation
# images, shards), audit it, build a WordPiece vocabulary and train the tiny
# ALIGN model on the shards, printing held-out retrieval recall.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL=2
OUT="${OUT:-out}"
# Library logging (TensorFlow, Beam, absl) goes to files here, not to the console.
export ALT_TEXT_CORPUS_LOG_DIR="$OUT/logs"
PY=.venv/bin/python
step() { echo "== $1 ($((SECONDS - START)) s so far)"; }
START=$SECONDS

step "generate the sample"
$PY -m samplegen --out "$OUT/sample"
mapfile -t BUILD_FLAGS < <($PY - "$OUT/sample" <<'PYEOF'
import json, os, sys
info = json.load(open(os.path.join(sys.argv[1], "sample_info.json")))
for override in info["build_overrides"]:
    print("--set"); print(override)
name, path = info["eval_images"].split("=", 1)
print("--eval_images"); print(f"{name}={os.path.join(sys.argv[1], path)}")
PYEOF
)
step "build the corpus"
$PY -m pipeline.build --input "$OUT/sample/candidates/*.parquet" --output "$OUT/corpus" \
    --preset align "${BUILD_FLAGS[@]}" --overwrite
step "audit"
$PY -m pipeline.audit "$OUT/corpus" | tail -1
step "wordpiece vocabulary"
$PY -m trainer.vocab --data_dir "$OUT/corpus" --vocab_size 2000
step "train tiny ALIGN"
rm -rf "$OUT/train"  # a fresh run each time; trainer.train itself resumes an existing workdir
$PY -m trainer.train --config trainer/configs/tiny.py --workdir "$OUT/train" \
    --config.data_dir="$OUT/corpus" --config.eval_dir="$OUT/sample/eval" \
    --config.compilation_cache_dir="$OUT/jax_cache"
$PY - "$OUT/train" <<'PYEOF'
import json, os, sys
last = {}
for line in open(os.path.join(sys.argv[1], "metrics.jsonl")):
    row = json.loads(line)
    if "retrieval/i2t_R@1" in row:
        last = row
print(f"after {last['step']} steps, held-out retrieval on the validation split "
      f"({last['retrieval/num_pairs']:.0f} pairs):")
for way, name in (("i2t", "image->text"), ("t2i", "text->image")):
    r1, chance = last[f"retrieval/{way}_R@1"], last[f"retrieval/{way}_R@1_chance"]
    print(f"  {name} R@1 {r1:.3f}  R@5 {last[f'retrieval/{way}_R@5']:.3f}  (chance R@1 {chance:.4f})")
if "knn/top1" in last:
    print(f"  kNN top-1 (nearest neighbour) {last['knn/top1']:.3f} over "
          f"{1 / last['knn/top1_chance']:.0f} classes (chance {last['knn/top1_chance']:.3f})")
if "zeroshot/top1" in last:
    print(f"  zero-shot top-1 {last['zeroshot/top1']:.3f} over {last['zeroshot/num_classes']:.0f} "
          f"classes (chance {last['zeroshot/top1_chance']:.3f})")
page = os.path.join(sys.argv[1], "retrieval.html")
if os.path.exists(page):
    print(f"retrieved examples: {page}")
PYEOF
step "done"

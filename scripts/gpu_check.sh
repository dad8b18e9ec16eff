#!/usr/bin/env bash
# GPU check (not part of the CPU test suite): on one GPU, train GPT-2 124M for a few steps as a single
# process and under FSDP (world size 1), each in fp16 (with accelerate's grad scaler; sharded under
# FSDP) and bf16, then print the five metrics side by side.
#
#   bash scripts/gpu_check.sh [OUT_DIR]          (default OUT_DIR: runs/gpu_check)
#
# Exits non-zero when no CUDA device is present or any run fails. A few minutes on one modern GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu_check}
steps=${GPU_CHECK_STEPS:-12}
python - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible; this check needs one GPU")
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
export WANDB_MODE=${WANDB_MODE:-offline}
# The bundled sample holds only a few 1024-token blocks: repeat its articles so that every run has a
# dozen optimizer steps of distinct batches (a check of the machinery, not of learning).
mkdir -p "$out"
python - "$out/corpus.jsonl" <<'EOF'
import csv, json, sys
with open("data/sample/all_the_news_sample.csv", newline="", encoding="utf-8") as f:
    articles = [row["content"] for row in csv.DictReader(f)]
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for copy in range(12):
        for text in articles:
            f.write(json.dumps({"text": f"({copy}) {text}"}) + "\n")
EOF
status=0
runs=()
for strategy in single fsdp; do
  config=accelerate_configs/single_gpu.yaml
  [ "$strategy" = fsdp ] && config=accelerate_configs/fsdp.yaml
  for precision in fp16 bf16; do
    dir="$out/runs/${strategy}-${precision}"
    echo "== $strategy $precision -> $dir"
    # 8 sequences of 1024 tokens per step: 2 micro-steps of 4.
    if accelerate launch --config_file "$config" --num_processes 1 --mixed_precision "$precision" \
        train.py --preset gpt2 --data "$out/corpus.jsonl" --strategy "$strategy" --max_steps "$steps" --micro_batch_size 4 \
        --global_batch_tokens 8192 --log_interval 4 --warmup_steps 4 --eval_blocks 16 \
        --output_dir "$dir" --overwrite --experiment gpu_check --export_hf 2>&1 | tail -n 3; then
      runs+=("$dir")
    else
      echo "gpu_check: $strategy $precision failed" >&2
      status=1
    fi
  done
done
python -m analysis.compare "${runs[@]}" --out "$out/report"
cat "$out/report/table.md"
exit $status

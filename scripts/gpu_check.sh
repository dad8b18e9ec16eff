#!/usr/bin/env bash
# GPU check (not part of the CPU test suite), offline. On one GPU:
#   1. the benchmark of our training step against transformers' GPT2LMHeadModel, GPT-2 124M, bf16 and
#      fp16, eager and compiled (tokens/s, ratio, MFU);
#   2. GPT-2 124M trained for a few steps as a single process and under each FSDP mode that one GPU
#      allows as one process (fsdp, fsdp_zero2, fsdp_offload), in fp16 (accelerate's grad scaler;
#      sharded under FSDP) and bf16, at the speed levers' defaults (train.py prints which are on);
#   3. the five metrics of every run side by side (the report's table).
#
#   bash scripts/gpu_check.sh [OUT_DIR]          (default OUT_DIR: runs/gpu_check)
#
# Environment: GPU_CHECK_STEPS (training steps per run, default 10), GPU_CHECK_STRATEGIES (default
# "single fsdp fsdp_zero2 fsdp_offload"), GPU_CHECK_PRECISIONS (default "fp16 bf16"), GPU_CHECK_BENCHMARK
# (0 skips step 1). Sized for about 8 minutes on one H100/H200-class GPU; each part prints its wall time.
# Exits non-zero when no CUDA device is present or any run fails. Needs no network: the tokenizer is
# bundled, the corpus is the bundled sample, W&B logs offline.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu_check}
steps=${GPU_CHECK_STEPS:-10}
strategies=${GPU_CHECK_STRATEGIES:-single fsdp fsdp_zero2 fsdp_offload}
precisions=${GPU_CHECK_PRECISIONS:-fp16 bf16}
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible; this check needs one GPU")
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
mkdir -p "$out"
status=0
if [ "${GPU_CHECK_BENCHMARK:-1}" != 0 ]; then
  echo "== benchmark: our step vs transformers' GPT2LMHeadModel"
  start=$SECONDS
  compile_flag=--compile
  # Below compute capability 8.0 (T4) compile is off by default in training; measure eager only there.
  python -c "import sys, torch; sys.exit(torch.cuda.get_device_capability(0) < (8, 0))" || compile_flag=
  if ! python -m benchmarks.step_vs_transformers --device cuda --sizes 124m --precision "${precisions// /,}" \
      $compile_flag | tee "$out/benchmark.txt"; then
    echo "gpu_check: benchmark failed" >&2
    status=1
  fi
  echo "== benchmark: $((SECONDS - start)) s"
fi
# The bundled sample holds only a few 1024-token blocks: repeat its articles so that every run has
# its steps on distinct batches (a check of the machinery, not of learning).
python - "$out/corpus.jsonl" <<'EOF'
import csv, json, sys
with open("data/sample/all_the_news_sample.csv", newline="", encoding="utf-8") as f:
    articles = [row["content"] for row in csv.DictReader(f)]
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for copy in range(12):
        for text in articles:
            f.write(json.dumps({"text": f"({copy}) {text}"}) + "\n")
EOF
runs=()
for strategy in $strategies; do
  case $strategy in
    single) config=accelerate_configs/single_gpu.yaml ;;
    *) config=accelerate_configs/$strategy.yaml ;;
  esac
  for precision in $precisions; do
    dir="$out/runs/${strategy}-${precision}"
    echo "== $strategy $precision -> $dir"
    start=$SECONDS
    # 8 sequences of 1024 tokens per step: 2 micro-steps of 4.
    if accelerate launch --config_file "$config" --num_processes 1 --mixed_precision "$precision" \
        train.py --preset gpt2 --data "$out/corpus.jsonl" --strategy "$strategy" --max_steps "$steps" --micro_batch_size 4 \
        --global_batch_tokens 8192 --log_interval 2 --warmup_steps 4 --perf_warmup_steps 3 --eval_blocks 16 \
        --output_dir "$dir" --overwrite --experiment gpu_check --no-export_hf 2>&1 | grep -E "^(levers|run|done|error)"; then
      runs+=("$dir")
    else
      echo "gpu_check: $strategy $precision failed" >&2
      status=1
    fi
    echo "== $strategy $precision: $((SECONDS - start)) s"
  done
done
python -m analysis.compare "${runs[@]}" --out "$out/report"
cat "$out/report/table.md"
[ -f "$out/benchmark.txt" ] && tail -n 6 "$out/benchmark.txt"
exit $status

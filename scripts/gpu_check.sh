#!/usr/bin/env bash
# GPU check (not part of the CPU test suite), offline. On one GPU:
#   1. the benchmark of our training step against transformers' GPT2LMHeadModel, GPT-2 124M, bf16 and
#      fp16, eager and compiled (tokens/s, ratio, MFU), 2 rounds of 2 s each;
#   2. GPT-2 124M trained for a few steps, eager, as a single process and under each FSDP mode that one GPU
#      allows as one process (default fsdp and fsdp_offload; add fsdp_zero2 through GPU_CHECK_STRATEGIES), in
#      fp16 (accelerate's grad scaler; sharded under FSDP) and bf16. Eager (--compile off) because step 3
#      compares these runs with the planner, which models the eager step (compiled blocks save other tensors);
#      step 1 measures compiled speed;
#   3. the planner against the measured memory of every run of step 2 (2 micro-batches of 4 x 1024 tokens per
#      step; with 3 warm-up steps the memory probe measures step 2, the first to start with AdamW's state):
#      `python -m planner --run` puts the predicted peak beside torch.cuda.max_memory_allocated and says
#      whether the error is within 10% (the target); scripts/gpu_terms.py puts the planner's GPU-only terms
#      beside it: this GPU's torch.cuda.get_device_properties(0).total_memory against the planner's usable
#      memory, and how much of each prediction is CUDA autocast's fp32 LayerNorm inputs (the error with and
#      without them). This step records: its result does not change the exit status (OUT_DIR/planner/check.txt);
#   4. the five metrics of every run of step 2 side by side (the report's table), then step 3's lines again.
#
#   bash scripts/gpu_check.sh [OUT_DIR]          (default OUT_DIR: runs/gpu_check)
#
# Environment: GPU_CHECK_STEPS (training steps per run, default 6), GPU_CHECK_STRATEGIES (default
# "single fsdp fsdp_offload"), GPU_CHECK_PRECISIONS (default "fp16 bf16"), GPU_CHECK_BENCHMARK
# (0 skips step 1), GPU_CHECK_PLANNER (0 skips step 3). Sized for under 6 minutes on one H100/H200-class GPU
# (estimated, not yet timed: step 1 about 2 minutes, most of it compiling; step 2 six launches of about 30 s,
# fsdp_offload's CPU AdamW adding about a second a step; step 3 under 20 s, no launches); each part prints
# its wall time. Exits non-zero when no CUDA device is present or any run of steps 1 and 2 fails. Needs no
# network: the tokenizer is bundled, the corpus is the bundled sample, W&B logs offline.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu_check}
steps=${GPU_CHECK_STEPS:-6}
strategies=${GPU_CHECK_STRATEGIES:-single fsdp fsdp_offload}
precisions=${GPU_CHECK_PRECISIONS:-fp16 bf16}
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible; this check needs one GPU")
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
# The start-up refusal's install command names the build read from torch/version.py without importing torch:
# on a CUDA torch it must be the build for the CUDA version the imported torch reports, never the CPU one.
from training.versions import torch_build
print(f"gpu_check: a refusal's install command here would name PyTorch's {torch_build()} build")
if torch.version.cuda and torch_build() != "cu" + "".join(torch.version.cuda.split(".")[:2]):
    sys.exit(f"gpu_check: torch/version.py read as {torch_build()}, torch.version.cuda is {torch.version.cuda}")
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
      --rounds 2 --round_s 2 $compile_flag | tee "$out/benchmark.txt"; then
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
        --compile off --output_dir "$dir" --overwrite --experiment gpu_check --no-export_hf 2>&1 \
        | grep -E "^(levers|run|done|error)"; then
      runs+=("$dir")
    else
      echo "gpu_check: $strategy $precision failed" >&2
      status=1
    fi
    echo "== $strategy $precision: $((SECONDS - start)) s"
  done
done
# 3. The planner's memory model (planner/cost_model.py) against this GPU, on step 2's runs. Nothing here
# changes the exit status: it records.
if [ "${GPU_CHECK_PLANNER:-1}" != 0 ] && [ ${#runs[@]} -gt 0 ]; then
  echo "== planner: predicted vs measured step peak, GPT-2 124M (target: within 10%), and its GPU-only terms"
  start=$SECONDS
  mkdir -p "$out/planner"
  : > "$out/planner/check.txt"
  for dir in "${runs[@]}"; do
    name=$(basename "$dir")
    if python -m planner --run "$dir" --json > "$out/planner/$name.plan.json"; then
      python - "$dir" "$out/planner/$name.plan.json" <<'EOF' | tee -a "$out/planner/check.txt" || echo "gpu_check: planner $name: no comparison" >&2
import json, sys
from pathlib import Path
run, plan = Path(sys.argv[1]), Path(sys.argv[2])
entry = json.loads(plan.read_text())["runs"][0]
rank = entry["ranks"][0]
predicted, measured = rank["predicted"]["step_peak"], rank["measured"].get("step_peak")
skipped = json.loads((run / "summary.json").read_text()).get("skipped_step_numbers") or []
if not measured:
    print(f"planner {run.name}: no measured peak in {run}/summary.json")
    sys.exit(0)
error = (predicted - measured) / measured * 100
verdict = "within 10%: yes" if abs(error) <= 10 else "within 10%: NO"
print(f"planner {run.name}: step {entry['probe_step']} peak predicted {predicted / 2**20:,.1f} MiB "
      f"(at {rank['peak_phase']}), max_memory_allocated {measured / 2**20:,.1f} MiB, error {error:+.2f}%, {verdict}")
for key in ("parameters", "gradients", "optimizer"):
    if key in rank["error_pct"]:
        print(f"  {key}: predicted {rank['predicted'][key] / 2**20:,.1f} MiB, error {rank['error_pct'][key]:+.2f}%")
time = entry.get("step_time") or {}
if time.get("predicted_s") and time.get("measured_s"):
    # The planner's step at its assumed MFU of the datasheet peak: a check of the time model's shape, not of the MFU.
    low, high = time["range_s"]
    print(f"  step time: predicted {time['predicted_s']:.3f} s ({low:.3f}-{high:.3f}) at MFU {time['mfu_given']:g} "
          f"(assumed), measured {time['measured_s']:.3f} s (mean of {time['measured_steps']} steps after the "
          f"warm-up), error {time['error_pct']:+.1f}%")
if any(step <= entry["probe_step"] for step in skipped):
    # A step the fp16 grad scaler skipped created no AdamW state: the probe step then lacks what the plan counts.
    print(f"  note: step(s) {skipped} skipped by the grad scaler; the optimizer state the plan counts may be missing")
EOF
    else
      echo "gpu_check: planner $name: plan failed (recorded, exit status unaffected)" >&2
      echo "planner $name: plan failed" >> "$out/planner/check.txt"
    fi
  done
  # The GPU-only terms: usable memory as CUDA reports it, and autocast's fp32 LayerNorm inputs in each prediction.
  python scripts/gpu_terms.py "${runs[@]}" | tee -a "$out/planner/check.txt" \
    || echo "gpu_check: scripts/gpu_terms.py failed (recorded, exit status unaffected)" >&2
  echo "== planner: $((SECONDS - start)) s"
fi
python -m analysis.compare "${runs[@]}" --out "$out/report"
cat "$out/report/table.md"
[ -f "$out/benchmark.txt" ] && tail -n 6 "$out/benchmark.txt"
[ -f "$out/planner/check.txt" ] && cat "$out/planner/check.txt"
exit $status

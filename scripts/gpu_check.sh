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
#      whether the error is within 10% (the target); lab/gpu_terms.py puts the planner's GPU-only terms
#      beside it: this GPU's torch.cuda.get_device_properties(0).total_memory against the planner's usable
#      memory, and how much of each prediction is CUDA autocast's fp32 LayerNorm inputs (the error with and
#      without them). This step records: its result does not change the exit status (OUT_DIR/planner/check.txt);
#   4. the five metrics of every run of step 2 side by side (the report's table), then step 3's lines again;
#   5. the fp16 cases of tests/test_fp16.py and test_fp16_resume.py (which run them on the CPU by
#      GPT2S_CPU_FP16=1) on this GPU, with CUDA's grad scaler: every fp16 run of step 2 has an overflow injected at step 3
#      (GPT2S_FAULT=inf_grad:step=3), which it must skip; the tiny preset in fp16 under fsdp (one process) with
#      the same overflow, run to step 8 with a checkpoint every step, then again stopped by SIGTERM during step 5
#      (GPT2S_FAULT=term:step=5) and resumed: step 3 skipped, the scale halved, the weights after step 3 equal
#      those after step 2, and the resumed steps 6-8 equal the uninterrupted run's, scaler state and all.
#
#   bash scripts/gpu_check.sh [OUT_DIR]          (default OUT_DIR: runs/gpu_check)
#
# Environment: GPU_CHECK_STEPS (training steps per run, default 6), GPU_CHECK_STRATEGIES (default
# "single fsdp fsdp_offload"), GPU_CHECK_PRECISIONS (default "fp16 bf16"), GPU_CHECK_BENCHMARK
# (0 skips step 1), GPU_CHECK_PLANNER (0 skips step 3), GPU_CHECK_FP16 (0 skips step 5's launches). Sized for
# about 6 minutes on one H100/H200-class GPU (estimated, not yet timed: step 1 about 2 minutes, most of it
# compiling; step 2 six launches of about 30 s, fsdp_offload's CPU AdamW adding about a second a step; step 3
# under 20 s, no launches; step 5 three launches of the tiny model, about 40 s); each part prints its wall time.
# Exits non-zero when no CUDA device is present, any run of steps 1 and 2 fails, or a check of step 5 fails.
# Needs no network: the tokenizer is bundled, the corpus is the bundled sample, W&B logs offline.
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
  if ! python -m lab.step_vs_transformers --device cuda --sizes 124m --precision "${precisions// /,}" \
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
fp16_runs=()
for strategy in $strategies; do
  case $strategy in
    single) config=accelerate_configs/single_gpu.yaml ;;
    *) config=accelerate_configs/$strategy.yaml ;;
  esac
  for precision in $precisions; do
    dir="$out/runs/${strategy}-${precision}"
    echo "== $strategy $precision -> $dir"
    start=$SECONDS
    # fp16: an overflow at step 3 (after the memory probe's step 2), which the grad scaler must skip (step 5 checks).
    fault=
    if [ "$precision" = fp16 ]; then fault=inf_grad:step=3; fi
    # 8 sequences of 1024 tokens per step: 2 micro-steps of 4.
    if GPT2S_FAULT=$fault accelerate launch --config_file "$config" --num_processes 1 --mixed_precision "$precision" \
        train.py --preset gpt2 --data "$out/corpus.jsonl" --strategy "$strategy" --max_steps "$steps" --micro_batch_size 4 \
        --global_batch_tokens 8192 --log_interval 2 --warmup_steps 4 --perf_warmup_steps 3 --eval_blocks 16 \
        --compile off --output_dir "$dir" --overwrite --experiment gpu_check --no-export_hf 2>&1 \
        | grep -E "^(levers|run|done|error)"; then
      runs+=("$dir")
      if [ "$precision" = fp16 ]; then fp16_runs+=("$dir"); fi
    else
      echo "gpu_check: $strategy $precision failed" >&2
      status=1
    fi
    echo "== $strategy $precision: $((SECONDS - start)) s"
  done
done
# 3. The planner's memory model (planner/cost_model.py) against this GPU, on step 2's runs. Nothing here
# changes the exit status: it records. First the machine profile on this GPU (planner/measure.py: the compute
# on the GPU under autocast, one process), which the planner's step times then read.
if [ "${GPU_CHECK_PLANNER:-1}" != 0 ] && [ ${#runs[@]} -gt 0 ]; then
  echo "== planner: predicted vs measured step peak, GPT-2 124M (target: within 10%), and its GPU-only terms"
  start=$SECONDS
  mkdir -p "$out/planner"
  : > "$out/planner/check.txt"
  for precision in $precisions; do
    python -m planner measure --presets gpt2 --processes 1 --precision "$precision" 2>&1 \
      | tee -a "$out/planner/measure.txt" || echo "gpu_check: planner measure $precision failed" >&2
  done
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
  python lab/gpu_terms.py "${runs[@]}" | tee -a "$out/planner/check.txt" \
    || echo "gpu_check: lab/gpu_terms.py failed (recorded, exit status unaffected)" >&2
  echo "== planner: $((SECONDS - start)) s"
fi
# 5. tests/test_fp16*.py's cases with CUDA's grad scaler: the tiny preset in fp16 under fsdp on one process, an
# overflow at step 3, to step 8 of a 12-step schedule; once whole, once stopped by SIGTERM during step 5 and resumed.
if [ "${GPU_CHECK_FP16:-1}" != 0 ]; then
  echo "== fp16: an overflow, a SIGTERM and a resume (tiny, fsdp, one process)"
  start=$SECONDS
  mkdir -p "$out/fp16"
  tiny=(--preset tiny --data "$out/corpus.jsonl" --strategy fsdp --max_steps 12 --stop_after_steps 8
        --checkpoint_interval 1 --keep_checkpoints 8 --eval_blocks 16 --wandb_mode disabled --no-export_hf)
  fp16=(accelerate launch --config_file accelerate_configs/fsdp.yaml --num_processes 1 --mixed_precision fp16 train.py)
  # The resume is checked for exact equality: these three runs (only these) take cuBLAS's fixed workspace and
  # torch's deterministic kernels, through a sitecustomize of their own (warn_only: an op without a deterministic
  # kernel is named in the log, and the equality check then says whether it mattered).
  mkdir -p "$out/fp16/site"
  echo "import torch; torch.use_deterministic_algorithms(True, warn_only=True)" > "$out/fp16/site/sitecustomize.py"
  fp16=(env CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH="$out/fp16/site${PYTHONPATH:+:$PYTHONPATH}" "${fp16[@]}")
  # The stopped launch ends non-zero (the signal's status): its lines are kept, its status is not the check's.
  GPT2S_FAULT=inf_grad:step=3 "${fp16[@]}" "${tiny[@]}" --output_dir "$out/fp16/whole" --overwrite 2>&1 \
    | grep -E "^(run|done|stopped|error)" || status=1
  GPT2S_FAULT=inf_grad:step=3,term:step=5 "${fp16[@]}" "${tiny[@]}" --output_dir "$out/fp16/stopped" --overwrite \
    2>&1 | grep -E "^(run|stopped|error|warning: SIGTERM)" || true
  "${fp16[@]}" "${tiny[@]}" --output_dir "$out/fp16/stopped" --resume 2>&1 | grep -E "^(resumed|done|stopped|error)" \
    || status=1
  python - "$out/fp16/whole" "$out/fp16/stopped" ${fp16_runs[@]+"${fp16_runs[@]}"} <<'EOF' | tee "$out/fp16/check.txt" || status=1
import json, sys
from pathlib import Path

import torch

from training.checkpoints.store import checkpoint_path, load_model_from_checkpoint

whole, stopped, *gpt2 = (Path(a) for a in sys.argv[1:])
failed = []


def check(ok, text):
    print(f"fp16 {'ok' if ok else 'FAILED'}: {text}")
    if not ok:
        failed.append(text)


def lines(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row for row in rows if row["kind"] == "train"}


def scaler(run, step):
    return json.loads((checkpoint_path(run, step) / "grad_scaler.json").read_text())


try:
    for run in (whole, *gpt2):
        skipped = json.loads((run / "summary.json").read_text())["skipped_step_numbers"]
        check(3 in skipped, f"{run.name}: step 3 skipped (skipped steps {skipped})")
    halved = scaler(whole, 3)["scale"] == scaler(whole, 2)["scale"] / 2
    check(halved, f"scale at steps 2 and 3: {scaler(whole, 2)['scale']}, {scaler(whole, 3)['scale']}")
    before, after = (load_model_from_checkpoint(checkpoint_path(whole, s)).state_dict() for s in (2, 3))
    check(all(torch.equal(before[k], after[k]) for k in before), "the weights after step 3 equal those after step 2")
    got, want = lines(stopped), lines(whole)
    resumed = json.loads((stopped / "config.json").read_text())["launch"].get("resumed_from") or {}
    check(sorted(got) == list(range(1, 9)) and resumed.get("step") == 5, "stopped after step 5, resumed from it")
    same = all(got.get(s, {}).get(k) == want[s][k] for s in range(6, 9) for k in ("loss", "grad_norm", "lr"))
    check(same, "resumed steps 6-8: loss, grad norm and learning rate equal the uninterrupted run's")
    check(scaler(stopped, 8) == scaler(whole, 8), f"the scaler at step 8 as uninterrupted: {scaler(stopped, 8)}")
except (OSError, KeyError, ValueError) as exc:  # a run that did not get as far as its files
    check(False, f"{type(exc).__name__}: {exc}")
sys.exit(1 if failed else 0)
EOF
  echo "== fp16: $((SECONDS - start)) s"
fi
python -m analysis.compare "${runs[@]}" --out "$out/report"
cat "$out/report/table.md"
[ -f "$out/benchmark.txt" ] && tail -n 6 "$out/benchmark.txt"
[ -f "$out/planner/check.txt" ] && cat "$out/planner/check.txt"
[ -f "$out/fp16/check.txt" ] && cat "$out/fp16/check.txt"
exit $status

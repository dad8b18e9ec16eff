"""Plan a run before it starts, and put finished runs beside their plan.

  python -m planner --preset gpt2 --gpu T4 --num_gpus 2 [--micro_batch_size N] [--block_size T]
                    [--precision fp16|bf16|fp32] [--global_batch_tokens N] [--activation_checkpointing]
                    [--attn_impl sdpa|math] [--gpu_memory_gib X] [--mfu F]
                    [--link_gb_s X | --link_from RUN_DIR] [--overlap full|none]
                    [--num_nodes M --inter_node_gb_s Y] [--json]
  python -m planner --run RUN_DIR... [--mfu F] [--host_update_gb_s X] [--json]
  python -m planner --preset P (--gpu G | --cpu --gpu_memory_gib X) --num_gpus N --launch [--execute]
  python -m planner --sweep --gpu G --num_gpus N [--figure PATH]
  python -m planner measure [--presets tiny] [--processes 1,2] [--threads 1] [--cache_dir DIR] [--out PATH]

The first form prints, for every strategy, the predicted bytes per device by kind, whether the step
fits the GPU, the largest micro-batch that fits, the predicted step time and tokens/s with the range
its assumptions allow, and a recommendation, or "no clear winner" when the fastest are closer than
that. The second reads finished runs and puts each prediction beside what the run measured
(summary.json's "memory", and the steady-state mean of its step times, predicted at --mfu of the run's
own peak, at the MFU, AdamW rate and link this machine's profile holds), with the error in percent. `measure`
(planner/measure.py) writes that profile. --launch (planner/launch.py) prints the
command of the fastest strategy that fits; --sweep (planner/sweep.py) plans every preset. The model behind both: planner/cost_model.py;
its formulas and their sources: docs/design/planning_model.md. Exit status 0, or 2 with one error line.
"""

from __future__ import annotations

import json
import sys

from planner.errors import PlanError
from planner.launch import launch_main
from planner.plan import compare_run, plan, plan_text, runs_text
from planner.request import parse_args
from planner.sweep import sweep_main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["measure"]:
        from planner.measure import measure_main

        return measure_main(argv[1:])
    args = parse_args(argv)
    try:
        if args.run:
            entries = [compare_run(path, args.mfu, args.host_update_gb_s, args.profile) for path in args.run]
            print(json.dumps({"runs": entries}, indent=2) if args.json else runs_text(entries))
        elif args.launch or args.sweep:
            return (launch_main if args.launch else sweep_main)(args)
        else:
            result = plan(args)
            print(json.dumps(result, indent=2) if args.json else plan_text(result))
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

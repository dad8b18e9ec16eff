"""The planner's GPU-only terms beside what a GPU measured (run by scripts/gpu_check.sh, never by the CPU tests).

  python lab/gpu_terms.py RUN_DIR...

For this GPU: torch.cuda.get_device_properties(0).total_memory beside the usable memory the planner's
table gives it (planner/gpus.py). For each finished run: the predicted step peak beside
torch.cuda.max_memory_allocated (summary.json's step peak), and how much of the prediction is CUDA
autocast's fp32 LayerNorm inputs (the same workload planned for the CPU, where autocast leaves layer_norm
in half precision, is that much smaller), with the error with and without that term. Prints; exit 0.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from the repository root

import torch  # noqa: E402

from planner.cost_model import activations  # noqa: E402
from planner.gpus import PLANNER_GPUS  # noqa: E402
from planner.plan import compare_run, read_json, run_workload  # noqa: E402

MIB = 2**20


def usable_memory_line() -> str:
    """This GPU's total_memory beside the planner's figure for it (matched on the exact device name)."""
    name = torch.cuda.get_device_name(0)
    total = torch.cuda.get_device_properties(0).total_memory
    planned = next((g for g in PLANNER_GPUS.values() if g.device_name == name), None)
    line = f"usable memory: {name} total_memory {total:,} bytes ({total / 2**30:.2f} GiB)"
    if planned is None:
        return line + "; not in the planner's table (planner/gpus.py)"
    error = (planned.memory_gib * 2**30 - total) / total * 100
    return (
        line + f"; the planner's {planned.key}: {planned.memory_gib:.2f} GiB ({planned.memory_source}), {error:+.2f}%"
    )


def run_lines(run: Path) -> list[str]:
    """Predicted vs measured step peak of one run, and the autocast LayerNorm term inside the prediction."""
    entry = compare_run(run)
    w, strategy, _ = run_workload(read_json(run / "config.json"), read_json(run / "summary.json"))
    rank = entry["ranks"][0]
    predicted, measured = rank["predicted"]["step_peak"], rank["measured"].get("step_peak")
    # The same activations under CPU autocast's rules (layer_norm in half): the difference is the fp32
    # LayerNorm term. It is in the peak only when the peak is the start of backward, where activations are kept.
    term = activations(w, strategy).kept - activations(replace(w, device="cpu"), strategy).kept
    without = predicted - (term if rank["peak_phase"] == "loss" else 0)
    head = f"{run.name}: {strategy} {w.precision}, step {entry['probe_step']} peak predicted {predicted / MIB:,.1f} MiB"
    if not measured:
        return [head + ", nothing measured"]
    error, error_without = ((p - measured) / measured * 100 for p in (predicted, without))
    return [
        head + f" (at {rank['peak_phase']}), measured {measured / MIB:,.1f} MiB, error {error:+.2f}%",
        f"  autocast fp32 LayerNorm inputs: {term / MIB:,.1f} MiB of the prediction; error without them "
        f"{error_without:+.2f}%",
    ]


def main(argv: list[str]) -> int:
    if torch.cuda.is_available():
        print(usable_memory_line())
    for run in map(Path, argv):
        try:
            print("\n".join(run_lines(run)))
        except Exception as exc:  # a record, not a gate: one unreadable run must not hide the others
            print(f"{run.name}: no comparison ({type(exc).__name__}: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

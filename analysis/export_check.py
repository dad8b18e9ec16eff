"""Cross-check a run's Hugging Face export: its loss on the run's own validation blocks against the recorded one.

    python -m analysis.export_check RUN_DIR [--json] [--batch_size N]

The validation blocks are rebuilt from config.json's data section through data/'s own pipeline (the packed
cache is keyed by content, so an existing entry is reused and a missing one rebuilt identically), and the
first `--eval_blocks` of them are taken by training's own `eval_subset`, in order: the blocks the run
validated on. RUN_DIR/hf is scored on them on the CPU by the project's perplexity metric
(analysis/metrics/perplexity, loaded with `evaluate.load` from that folder), in the precision the run
validated in (summary.json `precision`, `wrapper`): fp32; or autocast to bf16/fp16, as accelerate runs a
mixed-precision forward pass; or, under FSDP, with the parameters themselves in bf16/fp16 as FSDP's mixed
precision gathers them, and autocast. A reduced precision is also scored in fp32, and the per-token
difference between the two sizes the rounding allowance (docs/statistics.md, "The export check").

Exit status: 0 when the export's loss and summary.json's total.final_val_loss agree within the tolerance
(a relative 1e-4, plus the rounding allowance of a reduced precision); 1 when they differ (one line says
so); 2 on bad input (not a run directory, no export, no recorded loss).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.cli import EXIT_BAD_INPUT, OneLineParser, run_main
from training.records.schema import FINAL_VAL_LOSS

METRIC_DIR = Path(__file__).resolve().parent / "metrics" / "perplexity"
# The loss is the same model on the same blocks computed by a second implementation (Hugging Face's GPT-2
# instead of the project's): fp32 rounding differs in the last digits, a wrong block or weight by far more.
RELATIVE_TOLERANCE = 1e-4
# The rounding allowance of a reduced precision: the recorded loss and the export's score each carry that
# precision's rounding, a systematic part (at most |mean d| each, d the export's per-token difference from
# fp32) and a random part (sd(d) / sqrt(tokens) each, independent: sqrt(2) times that for their difference),
# taken at SIGMAS standard deviations.
SIGMAS = 4.0
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
FSDP_WRAPPER = "FSDPModule"  # summary.json `wrapper` of a run whose parameters FSDP gathers
EXIT_OK, EXIT_DIFFER = 0, 1
PROG = "python -m analysis.export_check"


class ExportError(ValueError):
    """The run cannot be checked (not a run directory, no export, no recorded loss); one line."""


@dataclass(frozen=True)
class ScoringPrecision:
    """How the run validated, and so how the export is scored: `precision` (fp32, bf16, fp16) in effect and
    whether FSDP held the parameters in it (`parameters`) or only the forward pass was autocast to it."""

    precision: str
    parameters: bool = False

    @property
    def reduced(self) -> bool:
        return self.precision in TORCH_DTYPES

    def describe(self) -> str:
        if not self.reduced:
            return "fp32"
        how = "parameters (as FSDP's mixed precision) and autocast" if self.parameters else "autocast"
        return f"{self.precision} {how}"

    def metric_kwargs(self) -> dict[str, Any]:
        """The perplexity metric's dtype (of the weights) and autocast for this precision."""
        if not self.reduced:
            return {"dtype": "float32"}
        dtype = TORCH_DTYPES[self.precision]
        return {"dtype": dtype if self.parameters else "float32", "autocast": dtype}


@dataclass(frozen=True)
class ExportCheck:
    """The export's score on the run's validation blocks beside what the run recorded."""

    run_dir: str
    blocks: int
    tokens: int
    loss: float  # in the run's precision (`scored_in`)
    perplexity: float
    recorded_final_val_loss: float
    scored_in: str  # ScoringPrecision.describe()
    loss_fp32: float  # the same in fp32: equal to `loss` for an fp32 run
    rounding_allowance: float = 0.0  # nats, from the per-token difference between the two; 0 for fp32

    @property
    def relative_difference(self) -> float:
        return abs(self.loss - self.recorded_final_val_loss) / abs(self.recorded_final_val_loss)

    @property
    def tolerance(self) -> float:
        """Relative: 1e-4 between two fp32 implementations, plus the rounding allowance of a reduced precision."""
        return RELATIVE_TOLERANCE + self.rounding_allowance / abs(self.recorded_final_val_loss)

    @property
    def agree(self) -> bool:
        return math.isfinite(self.loss) and self.relative_difference <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "relative_difference": self.relative_difference,
            "tolerance": self.tolerance,
            "tolerance_method": TOLERANCE_METHOD if self.rounding_allowance else "relative 1e-4 (fp32)",
            "agree": self.agree,
        }


TOLERANCE_METHOD = (
    f"relative {RELATIVE_TOLERANCE:g} plus the rounding allowance 2 |mean d| + {SIGMAS:g} sqrt(2) sd(d) / sqrt(tokens), "
    "d the export's per-token loss in the run's precision minus its fp32 loss (docs/statistics.md)"
)


def rounding_allowance(reduced: list[float], fp32: list[float]) -> float:
    """Nats by which two computations of the mean loss in one reduced precision may differ (see SIGMAS)."""
    d = np.asarray(reduced, dtype=float) - np.asarray(fp32, dtype=float)
    if d.size < 2:
        return float(2 * abs(d.mean())) if d.size else 0.0
    return float(2 * abs(d.mean()) + SIGMAS * math.sqrt(2) * d.std(ddof=1) / math.sqrt(d.size))


def scoring_precision(summary: dict[str, Any]) -> ScoringPrecision:
    """The precision the run validated in, as summary.json records it (fp32 when it does not say)."""
    precision = str(summary.get("precision") or "fp32")
    return ScoringPrecision(precision, precision in TORCH_DTYPES and summary.get("wrapper") == FSDP_WRAPPER)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ExportError(f"cannot read {path}: {err}") from None


def read_run(run_dir: Path) -> tuple[dict[str, Any], float, ScoringPrecision]:
    """config.json, the recorded final validation loss and the precision it was validated in; ExportError when
    the run cannot be checked."""
    if not (run_dir / "config.json").is_file() or not (run_dir / "summary.json").is_file():
        raise ExportError(f"{run_dir} is not a run directory (no config.json and summary.json)")
    if not (run_dir / "hf" / "config.json").is_file():
        raise ExportError(
            f"{run_dir} has no Hugging Face export (hf/); the run was trained with --no-export_hf or did not finish"
        )
    config, summary = _read_json(run_dir / "config.json"), _read_json(run_dir / "summary.json")
    recorded = (summary.get("total") or {}).get(FINAL_VAL_LOSS.key)
    if recorded is None:
        raise ExportError(f"{run_dir} records no final validation loss (summary.json total.final_val_loss)")
    if "data" not in config or "eval_blocks" not in config.get("run", {}):
        raise ExportError(f"{run_dir}/config.json lacks the data config or run.eval_blocks")
    return config, float(recorded), scoring_precision(summary)


def validation_blocks(data_config: dict[str, Any], eval_blocks: int) -> list[list[int]]:
    """The blocks the run validated on, each of block_size + 1 tokens, in the order it read them."""
    from data import DataConfig, DataError, build_datasets
    from training.step import eval_subset

    try:
        packed = build_datasets(DataConfig(**data_config), log=lambda line: None)
    except (DataError, TypeError, ValueError) as err:
        raise ExportError(f"cannot rebuild the validation split from config.json: {err}") from None
    # Training's items are (input_ids, labels) = (block[:-1], block[1:]); the metric takes the whole block.
    subset = eval_subset(packed.val, eval_blocks)
    return [[*item["input_ids"].tolist(), int(item["labels"][-1])] for item in subset]


def score(model_path: Path, blocks: list[list[int]], batch_size: int = 8, **precision: Any) -> dict[str, Any]:
    """The perplexity metric on `blocks`, loaded from the project's folder (never the hub), with every token's
    loss; `precision`: the metric's dtype and autocast."""
    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")  # read when evaluate is imported: before the import
    import evaluate

    metric = evaluate.load(str(METRIC_DIR))
    return metric.compute(
        predictions=blocks,
        model_path=str(model_path),
        batch_size=batch_size,
        device="cpu",
        token_losses=True,
        **{"dtype": "float32", **precision},
    )


def check_export(run_dir: Path, batch_size: int = 8) -> ExportCheck:
    """Score RUN_DIR/hf on the run's own validation blocks in its precision; ExportError when it cannot be checked."""
    config, recorded, precision = read_run(run_dir)
    blocks = validation_blocks(config["data"], int(config["run"]["eval_blocks"]))
    if not blocks:
        raise ExportError(f"{run_dir} has no validation blocks (val_fraction 0?)")
    fp32 = score(run_dir / "hf", blocks, batch_size)
    result = score(run_dir / "hf", blocks, batch_size, **precision.metric_kwargs()) if precision.reduced else fp32
    return ExportCheck(
        str(run_dir),
        len(blocks),
        int(result["tokens"]),
        float(result["loss"]),
        float(result["perplexity"]),
        recorded,
        precision.describe(),
        float(fp32["loss"]),
        rounding_allowance(result["token_losses"], fp32["token_losses"]) if precision.reduced else 0.0,
    )


def differ_line(check: ExportCheck) -> str:
    return (
        f"{check.run_dir}: the export's validation loss {check.loss:.6f} and the recorded final_val_loss "
        f"{check.recorded_final_val_loss:.6f} differ (scored in {check.scored_in}; relative "
        f"{check.relative_difference:.2e} > tolerance {check.tolerance:.2e})"
    )


def _text(check: ExportCheck) -> str:
    return (
        f"{check.run_dir}/hf on {check.blocks} validation blocks ({check.tokens:,} tokens): perplexity "
        f"{check.perplexity:.4f}, loss {check.loss:.6f} nats; recorded final_val_loss "
        f"{check.recorded_final_val_loss:.6f} (scored in {check.scored_in}; relative difference "
        f"{check.relative_difference:.2e}, tolerance {check.tolerance:.2e})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a training run's output directory")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--batch_size", type=int, default=8, help="blocks scored together (default 8)")
    args = parser.parse_args(argv)
    import transformers

    # The command's output is its one result line (or one error line); weight-loading bars would bury it.
    transformers.utils.logging.disable_progress_bar()
    try:
        check = check_export(args.run_dir, args.batch_size)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(check.to_dict()) if args.json else _text(check))
    if not check.agree:
        print(differ_line(check), file=sys.stderr)
        return EXIT_DIFFER
    return EXIT_OK


if __name__ == "__main__":
    run_main(main)

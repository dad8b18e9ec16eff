"""Training configuration: one dataclass per concern, validated on construction.

The accelerate YAML files hold only the launch layout (strategy, processes, precision); every
hyper-parameter lives here, and a run writes all of them, resolved, to `config.json`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from training.distributed import registry

STRATEGIES = (registry.AUTO, *registry.names())
WANDB_MODES = ("auto", "online", "offline", "disabled")


def _help(text: str, **kwargs: Any) -> Any:
    return field(metadata={"help": text}, **kwargs)


@dataclass
class ModelChoice:
    """Which GPT-2 to train; sizes come from the model preset (see model.GPT2Config.from_preset)."""

    model_preset: str = _help(
        "model size preset: gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl, mini, tiny", default="gpt2"
    )
    n_layer: int | None = _help(
        "transformer blocks instead of the model preset's (none: the preset's); a shallow model of a large "
        "preset's width runs the same command quickly on CPU",
        default=None,
    )
    dropout: float = _help("dropout for embeddings, attention and residuals (0 = off)", default=0.0)
    attn_impl: str = _help("attention kernel: sdpa (fused) or math (explicit softmax)", default="sdpa")

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.n_layer is not None and self.n_layer < 1:
            raise ValueError(f"--n_layer must be at least 1, got {self.n_layer}")
        if self.attn_impl not in ("sdpa", "math"):
            raise ValueError(f"--attn_impl must be sdpa or math, got {self.attn_impl!r}")


@dataclass
class OptimConfig:
    """Optimisation and the batch; the global batch is stated in tokens."""

    lr: float = _help("peak learning rate (after warm-up)", default=6e-4)
    min_lr_ratio: float = _help("final learning rate of the cosine decay, as a fraction of --lr", default=0.1)
    warmup_steps: int = _help("optimizer steps of linear warm-up from 0 to --lr", default=100)
    weight_decay: float = _help("AdamW decoupled weight decay, applied to matrices only", default=0.1)
    beta1: float = _help("AdamW beta1", default=0.9)
    beta2: float = _help("AdamW beta2", default=0.95)
    eps: float = _help("AdamW epsilon", default=1e-8)
    grad_clip: float = _help("clip the global gradient L2 norm to this (0 = measure only, no clipping)", default=1.0)
    micro_batch_size: int = _help("sequences per process per forward/backward", default=4)
    global_batch_tokens: int | None = _help(
        "tokens per optimizer step over all processes and accumulation micro-steps; must be a multiple of "
        "micro_batch_size x block_size x processes (none: one micro-batch per process, no accumulation)",
        default=None,
    )
    max_steps: int | None = _help(
        "optimizer steps to train (beats --epochs; --epochs alone on the command line beats a preset's max_steps)",
        default=None,
    )
    epochs: int | None = _help(
        "passes over the training blocks (none: 1 epoch, unless --max_steps is set)", default=None
    )

    def __post_init__(self) -> None:
        _positive("lr", self.lr)
        _positive("micro_batch_size", self.micro_batch_size)
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"--min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0:
            raise ValueError(f"--grad_clip must be >= 0, got {self.grad_clip}")
        if self.global_batch_tokens is not None:
            _positive("global_batch_tokens", self.global_batch_tokens)
        if self.max_steps is not None:
            _positive("max_steps", self.max_steps)
        if self.epochs is not None:
            _positive("epochs", self.epochs)


@dataclass
class RunConfig:
    """Where a run writes, how often it logs, evaluates and checkpoints, and how it is named."""

    output_dir: str = _help("run directory (metrics.jsonl, summary.json, checkpoints/, hf/)", default="runs/latest")
    seed: int = _help("seed for initialisation, dropout and data order (same seed = same data order)", default=1337)
    resume: bool = _help(
        "continue from the newest complete checkpoint in --output_dir; load only checkpoints you trust: the index "
        "of its tensors (torch.distributed.checkpoint's .metadata) is a Python pickle, which can run code "
        "(docs/faults.md)",
        default=False,
    )
    overwrite: bool = _help(
        "start afresh in an --output_dir that already holds a run (its files are replaced)", default=False
    )
    auto_resume: bool = _help(
        "continue from the newest complete checkpoint in --output_dir when there is one, else start afresh "
        "(replacing what a crashed attempt left): the same command for the first launch and every restart "
        "(a re-run notebook cell, a requeued SLURM job); a torchrun restart (--max_restarts) does this anyway; "
        "load only checkpoints you trust: the index of their tensors (.metadata) is a Python pickle, which can "
        "run code (docs/faults.md)",
        default=False,
    )
    resume_step: int | None = _help(
        "continue from the verified checkpoint of this step in --output_dir, not the newest (roll back past a "
        "loss spike): the newer checkpoints are renamed step_N.rolled_back (kept, never counted or resumed "
        "from) and metrics.jsonl is cut back to this step; implies --resume; load only checkpoints you trust: "
        "the index of their tensors (.metadata) is a Python pickle, which can run code (docs/faults.md)",
        default=None,
    )
    init_from: str | None = _help(
        "start a new run (step 0, fresh optimizer and schedule, any settings) from the model weights of a run "
        "folder (its newest verified checkpoint) or a checkpoint folder, written by any strategy and process "
        "count; config.json records the source. Only from a source you trust: its index of the weights "
        "(.metadata) is a Python pickle, which can run code, read before the output folder is claimed",
        default=None,
    )
    strategy: str = _help(
        "strategy this run must use: auto (whatever the launch config gives) or one of "
        + ", ".join(registry.names())
        + " (see accelerate_configs/); a mismatch with what is in effect stops the "
        "run at start-up",
        default=registry.AUTO,
    )
    log_interval: int = _help(
        "optimizer steps between metric lines: the steps' losses are reduced over processes and read only then "
        "(every step still synchronizes: its clock, and the all-reduce of its finite-loss and stop-signal check)",
        default=10,
    )
    eval_interval: int = _help("optimizer steps between validations (0 = at each epoch end and at the end)", default=0)
    eval_blocks: int = _help(
        "validation blocks per validation, over all processes: the first N of the validation split, the same "
        "blocks under every strategy (0 = the whole split)",
        default=200,
    )
    checkpoint_interval: int = _help("optimizer steps between checkpoints (0 = only at the end)", default=0)
    keep_checkpoints: int = _help("newest checkpoints to keep (older ones are deleted)", default=2)
    checkpoint_async: bool = _help(
        "write --checkpoint_interval checkpoints beside training (DCP's async_save: training waits only for the "
        "copy to host memory; each save waits for the one before); the last save and a signal's always wait",
        default=True,
    )
    stop_after_steps: int | None = _help(
        "stop (with a checkpoint) after this many steps although the schedule runs to --max_steps; "
        "simulates an interrupted job",
        default=None,
    )
    perf_warmup_steps: int = _help(
        "first optimizer steps reported separately and left out of throughput/MFU averages", default=3
    )
    max_nonfinite_steps: int = _help(
        "stop after this many steps in a row with a non-finite loss or grad norm (a step the fp16 grad scaler "
        "skips counts only once its loss scale is down to 1); no checkpoint is written during such a streak "
        "(0 = never stop)",
        default=5,
    )
    collective_timeout_s: int = _help(
        "seconds a rank waits in a collective for the others before the job fails (a rank that died or hangs)",
        default=600,
    )
    export_hf: bool = _help("write the final model as a Hugging Face folder to OUTPUT_DIR/hf", default=True)
    dataloader_workers: int = _help("DataLoader worker processes per training process", default=0)
    experiment: str | None = _help("experiment name: the W&B group that puts strategies side by side", default=None)
    run_name: str | None = _help("run name (none: <strategy>-<world size>x-<precision>)", default=None)
    repeat: int | None = _help(
        "which repeat of the same strategy and seed this run is (analysis.experiment --repeats sets it); recorded only",
        default=None,
    )
    arm: str | None = _help(
        "the experiment arm this run belongs to when one strategy runs under several labels (analysis.experiment "
        "--strategies ddp ddp sets ddp#2); the report compares arms, not strategies; recorded only",
        default=None,
    )
    wandb_project: str = _help("W&B project", default="gpt2-strategies")
    wandb_entity: str | None = _help("W&B entity (team or user; none: yours)", default=None)
    wandb_mode: str = _help("auto (online when logged in, else offline), online, offline or disabled", default="auto")
    wandb_finish_timeout_s: float = _help(
        "seconds the end of an online run waits for W&B to finish uploading; then the run ends anyway and "
        "`wandb sync` uploads the rest later (0 = wait as long as the upload takes)",
        default=60.0,
    )

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.wandb_mode not in WANDB_MODES:
            raise ValueError(f"--wandb_mode must be one of {', '.join(WANDB_MODES)}, got {self.wandb_mode!r}")
        if self.arm is not None and arm_index(self.arm, self.strategy) is None:
            raise ValueError(
                f"--arm must be {self.strategy}#K with K >= 2 (another label of --strategy), got {self.arm!r}"
            )
        _positive("log_interval", self.log_interval)
        for name in (
            "eval_interval",
            "eval_blocks",
            "checkpoint_interval",
            "perf_warmup_steps",
            "dataloader_workers",
            "max_nonfinite_steps",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}")
        _positive("keep_checkpoints", self.keep_checkpoints)
        _positive("collective_timeout_s", self.collective_timeout_s)
        if not self.wandb_finish_timeout_s >= 0:  # also refuses nan
            raise ValueError(f"--wandb_finish_timeout_s must be >= 0, got {self.wandb_finish_timeout_s}")
        if self.stop_after_steps is not None:
            _positive("stop_after_steps", self.stop_after_steps)
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite contradict each other: choose one")
        if self.auto_resume and self.overwrite:
            raise ValueError("--auto_resume and --overwrite contradict each other: choose one")
        self._check_starting_point()

    def _check_starting_point(self) -> None:
        """--resume_step picks a checkpoint to continue; --init_from starts a new run: each excludes the others."""
        if self.resume_step is not None:
            _positive("resume_step", self.resume_step)
            for other in ("overwrite", "auto_resume"):
                if getattr(self, other):
                    raise ValueError(f"--resume_step and --{other} contradict each other: choose one")
        if self.init_from is not None:
            for other in ("resume", "auto_resume", "resume_step"):
                if getattr(self, other) not in (False, None):
                    raise ValueError(
                        f"--init_from starts a new run from a checkpoint's weights, --{other} continues this "
                        f"run: choose one"
                    )


@dataclass
class SpeedConfig:
    """Speed and memory levers; `auto` picks what helps on the device (see docs/performance.md)."""

    compile: str = _help(
        "torch.compile each transformer block: auto (on for CUDA GPUs of compute capability 8.0+; off on CPU, "
        "where the compiled step measured slower than eager, and on T4/sm75 and older, where inductor's "
        "kernels are slower or fail to build), on, off",
        default="auto",
    )
    activation_checkpointing: bool = _help(
        "recompute each block's activations in backward instead of keeping them (less memory, about a third "
        "more compute): in the model for single/DDP, through accelerate's FSDP option under FSDP",
        default=False,
    )
    fused_adamw: str = _help(
        "fused AdamW (one kernel for the whole update): auto (on for CUDA), on (where torch has the kernel), off",
        default="auto",
    )
    tf32: str = _help(
        "fp32 matmuls on TF32 tensor cores: auto (on for compute capability 8.0+, Ampere and newer), on, off",
        default="auto",
    )
    pin_memory: bool = _help(
        "pinned host memory for the DataLoader's batches (CUDA only; no effect on CPU)", default=True
    )

    def __post_init__(self) -> None:
        for name in ("compile", "fused_adamw", "tf32"):
            if getattr(self, name) not in ("auto", "on", "off"):
                raise ValueError(f"--{name} must be auto, on or off, got {getattr(self, name)!r}")


def arm_index(arm: str, strategy: str) -> int | None:
    """K of an arm labelled `strategy#K` (K >= 2: the strategy's second, third... label in an experiment);
    None for anything else, such as another strategy's name, which would make the report compare the
    wrong thing."""
    prefix = f"{strategy}#"
    number = arm[len(prefix) :]
    if not arm.startswith(prefix) or not number.isdigit() or not number.isascii():
        return None
    return int(number) if int(number) >= 2 else None


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"--{name} must be > 0, got {value}")


@dataclass
class TrainConfig:
    """Everything one training run needs, resolved from defaults, a preset and the command line."""

    preset: str
    model: ModelChoice
    data: Any  # data.DataConfig (kept untyped here so this module imports without the data stack)
    optim: OptimConfig
    run: RunConfig
    speed: SpeedConfig = field(default_factory=SpeedConfig)

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "model": asdict(self.model),
            "data": asdict(self.data),
            "optim": asdict(self.optim),
            "run": asdict(self.run),
            "speed": asdict(self.speed),
        }


# ---------------------------------------------------------------------------------------------
# Named presets: values that override the dataclass defaults; flags override them again


@dataclass(frozen=True)
class Preset:
    description: str
    values: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        "2-layer, 64-wide GPT-2 on 64-token blocks; a CPU run of a few dozen steps takes about a minute on 2 cores",
        {
            "model_preset": "tiny",
            "block_size": 64,
            "micro_batch_size": 8,
            # 16 sequences: 2 micro-steps in one process, 1 per process with 2 processes.
            "global_batch_tokens": 16 * 64,
            "lr": 1e-3,
            "warmup_steps": 5,
            "max_steps": 30,
            "log_interval": 1,
            "eval_blocks": 64,
        },
    ),
    "mini": Preset(
        "4-layer, 128-wide GPT-2 on 128-token blocks; a few minutes on CPU",
        {
            "model_preset": "mini",
            "block_size": 128,
            "micro_batch_size": 8,
            "global_batch_tokens": 16 * 128,
            "lr": 1e-3,
            "warmup_steps": 20,
            "log_interval": 5,
            "eval_blocks": 64,
        },
    ),
    "gpt2": Preset(
        "GPT-2 124M on 1024-token blocks, the reference experiment's model (sized for 2x T4, fp16)",
        {
            "model_preset": "gpt2",
            "block_size": 1024,
            # 4 x 1024 tokens per micro-step fits a 16 GB T4 in fp16; 16 sequences per optimizer step
            # gives 4 micro-steps on one GPU and 2 per GPU on two.
            "micro_batch_size": 4,
            "global_batch_tokens": 16 * 1024,
            "lr": 6e-4,
            "warmup_steps": 100,
            "log_interval": 10,
        },
    ),
    # The larger GPT-2s keep the 124M preset's global batch (16 x 1024 tokens); the learning rates are those
    # GPT-3's paper (Table 2.1) used at these sizes. The micro-batch and activation checkpointing are what
    # `python -m planner --preset P --gpu T4 --num_gpus 2 --launch` picks for 2x T4 in fp16, with the
    # strategy it launches (tests/test_plan_launch.py keeps them equal; docs/scaling_models.md).
    "gpt2-medium": Preset(
        "GPT-2 355M (24 layers, 1024 wide) on 1024-token blocks; sized for 2x T4, fp16, by the planner: fsdp, "
        "micro-batch 4 (single fits too; ddp does not)",
        {
            "model_preset": "gpt2-medium",
            "block_size": 1024,
            "micro_batch_size": 4,
            "global_batch_tokens": 16 * 1024,
            "lr": 3e-4,
            "warmup_steps": 100,
            "log_interval": 10,
        },
    ),
    "gpt2-large": Preset(
        "GPT-2 774M (36 layers, 1280 wide) on 1024-token blocks; sized for 2x T4, fp16, by the planner: fsdp, "
        "micro-batch 2 (single and ddp do not fit)",
        {
            "model_preset": "gpt2-large",
            "block_size": 1024,
            "micro_batch_size": 2,
            "global_batch_tokens": 16 * 1024,
            "lr": 2.5e-4,
            "warmup_steps": 100,
            "log_interval": 10,
        },
    ),
    "gpt2-xl": Preset(
        "GPT-2 1.5B (48 layers, 1600 wide) on 1024-token blocks; sized for 2x T4, fp16, by the planner: fsdp, "
        "micro-batch 1 with activation checkpointing (only fsdp and fsdp_offload fit)",
        {
            "model_preset": "gpt2-xl",
            "block_size": 1024,
            "micro_batch_size": 1,
            "global_batch_tokens": 16 * 1024,
            "activation_checkpointing": True,
            "lr": 2e-4,
            "warmup_steps": 100,
            "log_interval": 10,
        },
    ),
}


def preset_overrides(name: str) -> dict[str, Any]:
    try:
        return dict(PRESETS[name].values)
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None


# ---------------------------------------------------------------------------------------------
# The one exception training raises for problems a user can fix


class RunError(Exception):
    """A problem with the run's settings or output directory; the message is one line."""

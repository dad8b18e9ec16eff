"""Per-device memory and step time of each strategy, predicted from the model's shape alone.

Every formula follows what this project's code allocates (model/gpt2.py, training/step.py, accelerate's
DDP and FSDP2 wrapping), checked tensor by tensor against PyTorch's MemTracker on the CPU; the
derivation and sources of each term are in docs/design/planning_model.md. Arithmetic only: nothing is allocated.

Bytes are per device (per process). "Device" memory is where the step computes; with FSDP's CPU offload
the sharded model state lives in host memory instead, and is reported as `host`.

Strategies are told apart by their traits in training/distributed/registry.py (whether they shard, offload, how they
communicate and gather), never by name: a strategy that shards and communicates like an existing one is
counted by these formulas without a line here. Functions take a strategy's name (or its registry entry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from model.config import GPT2Config
from model.shapes import WTE, flops_per_token, parameter_shapes, total_parameters
from training.distributed import registry
from training.distributed.registry import Communication, Strategy

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
ADAMW_STATE_BYTES = 8  # exp_avg and exp_avg_sq in fp32, whatever the training precision
ADAMW_STEP_BYTES = 4  # torch's AdamW keeps one float32 `step` tensor per parameter tensor
FP32 = 4


@dataclass(frozen=True)
class Workload:
    """One training configuration, as the planner sees it."""

    model: GPT2Config
    micro_batch_size: int
    block_size: int
    precision: str = "fp32"  # fp32 | fp16 | bf16 (mixed precision through autocast; FSDP also casts parameters)
    world_size: int = 1  # devices taking part (1 for a strategy that runs one process)
    grad_accum_steps: int = 1
    activation_checkpointing: bool = False
    fused_adamw: bool = False  # one fused update kernel: no step-sized temporary
    device: str = "cuda"  # cuda | cpu: the CPU's multi-tensor ops loop over tensors, with a temporary each
    first_step: bool = False  # the optimizer state is created during this step (a run's first step)
    num_nodes: int = 1  # machines the world_size devices are spread over, evenly (hybrid sharding's replicas)

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.world_size % self.num_nodes:
            raise ValueError(f"world_size {self.world_size} does not spread evenly over {self.num_nodes} machine(s)")
        if self.precision not in DTYPE_BYTES:
            raise ValueError(f"precision must be one of {', '.join(DTYPE_BYTES)}, got {self.precision!r}")
        for name in ("micro_batch_size", "block_size", "world_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.block_size > self.model.n_positions:
            raise ValueError(f"block_size {self.block_size} exceeds the model's {self.model.n_positions} positions")


# ---------------------------------------------------------------------------------------------------
# Parameters


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def shard_numel(shape: tuple[int, ...], world_size: int, rank: int) -> int:
    """Elements of `rank`'s FSDP2 shard: dim 0 cut as torch.chunk cuts it (ceil-sized pieces, the last short)."""
    rows = math.ceil(shape[0] / world_size)
    held = max(0, min(rows, shape[0] - rank * rows))
    return held * numel(shape[1:])


def _root_names(cfg: GPT2Config) -> list[str]:
    """The parameters of FSDP's root unit: everything outside the blocks (each block is a unit of its own)."""
    return [name for name in parameter_shapes(cfg) if ".h." not in name]


def _block_numel(cfg: GPT2Config) -> int:
    shapes = parameter_shapes(cfg)
    return sum(numel(s) for name, s in shapes.items() if name.startswith("transformer.h.0."))


def _linear_weight_numel(cfg: GPT2Config) -> int:
    """Elements of every matrix a matmul reads: the blocks' four Linear weights and the tied output head."""
    C, H = cfg.n_embd, cfg.mlp_size
    return cfg.n_layer * (3 * C * C + C * C + H * C + C * H) + cfg.vocab_size * C


# ---------------------------------------------------------------------------------------------------
# Model state: parameters, gradients, optimizer state


@dataclass(frozen=True)
class ModelState:
    parameters: int
    gradients: int
    optimizer: int
    on_host: bool = False  # FSDP's CPU offload keeps all three in host memory

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def model_state(w: Workload, strategy: str | Strategy, rank: int = 0) -> ModelState:
    """What `rank` holds after an optimizer step: fp32 parameters, fp32 gradients, AdamW's two moments and steps.

    Mixed precision does not change these: autocast casts on the fly and FSDP's mixed-precision policy
    casts only the gathered copies; the kept parameters, their gradients and the moments stay fp32.
    """
    s = checked(strategy, w)
    shapes = parameter_shapes(w.model).values()
    elements = sum(_held_numel(shape, s, w, rank) for shape in shapes)
    return ModelState(
        parameters=elements * FP32,
        gradients=elements * FP32,
        optimizer=elements * ADAMW_STATE_BYTES + len(shapes) * ADAMW_STEP_BYTES,
        on_host=s.offloads,
    )


# ---------------------------------------------------------------------------------------------------
# Activations and the logits


@dataclass(frozen=True)
class ElementBytes:
    """Bytes per element of the saved activations: the residual stream, LayerNorm outputs as the next matmul
    saves them, and everything else a block saves."""

    residual: int
    normed: int
    other: int
    ln_input: int  # a LayerNorm's input as it saves it for backward (the residual stream, or an fp32 cast of it)


# Ops that CUDA autocast runs in fp32, casting half inputs up (PyTorch's aten/src/ATen/autocast_mode.cpp,
# the CUDA fp32 list, KERNEL_CUDA(layer_norm, fp32)). CPU autocast's fp32 list has no layer_norm: there
# it runs in the input's dtype. Only the ops that change what the step saves are listed.
AUTOCAST_FP32_OPS = {"cuda": frozenset({"layer_norm"}), "cpu": frozenset()}


def element_bytes(w: Workload, strategy: str | Strategy) -> ElementBytes:
    if w.precision == "fp32":
        return ElementBytes(4, 4, 4, 4)
    half = DTYPE_BYTES[w.precision]
    if entry(strategy).shards:
        # FSDP's policy gathers parameters in half precision, so the embeddings and the residual stream are
        # too. Where autocast runs layer_norm in fp32 (CUDA), each LayerNorm casts its half input to an fp32
        # copy and saves that copy, not the half tensor (which nothing else keeps): 4 bytes per element.
        ln_input = FP32 if "layer_norm" in AUTOCAST_FP32_OPS.get(w.device, frozenset()) else half
        return ElementBytes(half, half, half, ln_input)
    # Autocast alone: the embeddings and the residual additions stay fp32; matmul inputs and outputs are half.
    return ElementBytes(4, half, half, 4)


@dataclass(frozen=True)
class Activations:
    per_block: int  # what one block saves for its backward
    blocks: int  # what all blocks keep between forward and backward (only their inputs with checkpointing)
    head: int  # the final LayerNorm's input and output, kept for the output head's backward
    weight_copies: int  # autocast's half-precision copies of the fp32 weights, saved by the matmuls
    logits: int  # the peak of the loss at the start of backward (see logits_bytes)

    @property
    def kept(self) -> int:
        return self.blocks + self.head + self.weight_copies


def logits_bytes(w: Workload) -> int:
    """12 bytes per logit: the fp32 log-softmax output (saved), its gradient and the logits' gradient.

    model/gpt2.py computes the loss in fp32 whatever the precision, so at the start of backward three
    fp32 tensors of micro_batch x block x vocab exist at once; the half-precision logits (2 bytes) are
    gone by then, and their gradient (2 bytes) comes after the log-softmax's saved output is freed.
    """
    return 3 * FP32 * w.micro_batch_size * w.block_size * w.model.vocab_size


def activations(w: Workload, strategy: str | Strategy) -> Activations:
    cfg, B, T = w.model, w.micro_batch_size, w.block_size
    s = B * T * cfg.n_embd  # elements of one (B, T, C) tensor
    e = element_bytes(w, strategy)
    ln_stats = 2 * FP32 * B * T  # LayerNorm keeps a mean and a reciprocal std per position, in fp32
    # Per block: the LayerNorms' inputs (the residual stream, as each LayerNorm saves it), their outputs as
    # the next matmul saves them,
    # q/k/v (3), the attention output (1), the MLP's expansion (4) and its GELU (4); (B, T, C) each.
    per_block = s * (2 * e.ln_input + 2 * e.normed + 12 * e.other) + 2 * ln_stats
    if cfg.attn_impl == "sdpa":
        per_block += FP32 * B * cfg.n_head * T  # the fused kernel's log-sum-exp per row
    else:
        per_block += B * cfg.n_head * T * T * e.other + T * T  # the softmax probabilities and the causal mask
    blocks = cfg.n_layer * (s * e.residual if w.activation_checkpointing else per_block)
    head = s * (e.ln_input + e.normed) + ln_stats  # ln_f's input, and its output as the output head saves it
    # FSDP's policy casts the gathered parameters themselves; autocast alone caches a half copy of each matrix.
    autocast_copies = w.precision != "fp32" and not entry(strategy).shards
    weight_copies = DTYPE_BYTES[w.precision] * _linear_weight_numel(cfg) if autocast_copies else 0
    return Activations(per_block, blocks, head, weight_copies, logits_bytes(w))


# ---------------------------------------------------------------------------------------------------
# The peak of one step


@dataclass(frozen=True)
class StepMemory:
    """Predicted bytes per device at the step's peak, by kind, and the candidates the peak was taken from."""

    strategy: str
    parameters: int  # kept parameters on the device (local shards under FSDP)
    gradients: int  # gradients on the device at the peak
    optimizer: int
    activations: int  # saved activations (and autocast's weight copies) at the peak
    logits: int  # the loss's tensors at the peak
    communication: int  # DDP's gradient buckets; FSDP's gathered (unsharded) parameters at the peak
    temporaries: int  # anything else live at the peak (the optimizer's or the embedding gradient's)
    peak_phase: str
    phases: dict[str, int] = field(default_factory=dict)
    host: int = 0  # FSDP offload: model state in host memory

    @property
    def total(self) -> int:
        return (
            self.parameters
            + self.gradients
            + self.optimizer
            + self.activations
            + self.logits
            + self.communication
            + self.temporaries
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "logits": self.logits,
            "communication": self.communication,
            "temporaries": self.temporaries,
            "total": self.total,
            "host": self.host,
            "peak_phase": self.peak_phase,
            "phases": dict(self.phases),
        }


def step_memory(w: Workload, strategy: str | Strategy, rank: int = 0, host_is_device: bool = False) -> StepMemory:
    """The largest of three moments of a step (a CPU run has one memory: pass host_is_device for offload):

    * loss: the start of backward, every activation saved and the loss's three vocabulary-sized tensors;
    * embedding: the end of backward, where the token embedding's two gradients (from the output head
      and from the lookup) are summed into a third while the other gradients are complete;
    * optimizer: the AdamW update, with the step-sized temporary of the multi-tensor implementation.
    """
    s = checked(strategy, w)
    state = model_state(w, s, rank)
    acts = activations(w, s)
    on_device = not state.on_host or host_is_device
    params, grads, optimizer = (state.parameters, state.gradients, state.optimizer) if on_device else (0, 0, 0)
    optimizer_at_start = 0 if w.first_step else optimizer
    # Parameters are computed in fp32 under autocast and in the policy's dtype under FSDP; gradients too.
    compute = _compute_bytes(w, s)
    grads_held = _gradients_held(w, s, grads, compute)
    comm_loss, comm_embedding, comm_optimizer = _communication_held(w, s, state, compute)
    loss = params + optimizer_at_start + grads_held + acts.kept + acts.logits + comm_loss
    # The embedding's gradient is summed in the gradients' dtype (the compute dtype: FSDP's unsharded
    # gradients are reduce-scattered after). With accumulation its earlier micro-batches' part is held too.
    other_grads = grads_held or (
        grads - _wte_share(w, s, rank) * FP32 + _root_grads_whole(w, s, rank, compute) if on_device else grads
    )
    embedding_sum = 3 * compute * w.model.vocab_size * w.model.n_embd
    embedding = params + optimizer_at_start + other_grads + embedding_sum + comm_embedding
    update_temp = _update_temporaries(w, s, rank) if on_device else 0
    update = params + grads + optimizer + update_temp + comm_optimizer
    phases = {"loss": loss, "embedding": embedding, "optimizer": update}
    peak_phase = max(phases, key=lambda k: phases[k])
    # What each phase holds, by kind: parameters, gradients, optimizer, activations, logits, communication,
    # temporaries (StepMemory's order).
    kinds = {
        "loss": (params, grads_held, optimizer_at_start, acts.kept, acts.logits, comm_loss, 0),
        "embedding": (params, other_grads, optimizer_at_start, 0, 0, comm_embedding, embedding_sum),
        "optimizer": (params, grads, optimizer, 0, 0, comm_optimizer, update_temp),
    }
    return StepMemory(s.name, *kinds[peak_phase], peak_phase, phases, 0 if on_device else state.total)


def _gradients_held(w: Workload, s: Strategy, grads: int, compute: int) -> int:
    """Earlier micro-batches' gradients, kept for the sum. A sharding strategy does not reduce-scatter until
    the last micro-batch (accelerate turns gradient sync off before it), so it holds them unsharded."""
    if w.grad_accum_steps == 1:
        return 0
    return compute * total_parameters(w.model) if s.shards else grads


def _communication_held(w: Workload, s: Strategy, state: ModelState, compute: int) -> tuple[int, int, int]:
    """Bytes held for communication at the loss, embedding and optimizer phases."""
    cfg = w.model
    if s.communication is Communication.ALL_REDUCE:
        # DDP copies gradients into buckets of their own dtype for the all-reduce (gradient_as_bucket_view off).
        return state.gradients, state.gradients, state.gradients
    if s.communication in (Communication.GATHER_SCATTER, Communication.HYBRID):
        root = sum(numel(parameter_shapes(cfg)[n]) for n in _root_names(cfg))
        # The root unit stays gathered from forward to backward; of the blocks, those whole when backward
        # starts (FSDP prefetches the last one; all of them when kept unresharded after forward).
        blocks_gathered = s.blocks_gathered_at_backward_start(cfg.n_layer)
        # At the embedding's sum the first block's reduce-scatter input (its unsharded gradients) is still
        # held: FSDP2 frees a unit's input only when the next unit's reduce-scatter is issued, the root's.
        return (compute * (root + blocks_gathered * _block_numel(cfg)), compute * (root + _block_numel(cfg)), 0)
    return 0, 0, 0


def shard_group_size(w: Workload, s: Strategy) -> int:
    """Devices a sharding strategy splits the model over: all of them, or under hybrid sharding those of one
    machine (the model is replicated across machines)."""
    return w.world_size // w.num_nodes if s.fsdp is not None and s.fsdp.hybrid else w.world_size


def sharded_span(w: Workload, s: Strategy) -> tuple[int, int]:
    """The processes and machines one shard group spans (`shard_group_size`): one machine's under hybrid
    sharding, all of them otherwise."""
    hybrid = s.fsdp is not None and s.fsdp.hybrid
    return shard_group_size(w, s), 1 if hybrid else w.num_nodes


def _held_numel(shape: tuple[int, ...], s: Strategy, w: Workload, rank: int) -> int:
    """Elements of a parameter tensor that `rank` keeps: its shard when the strategy shards, else all. Ranks
    are numbered machine by machine, so `rank`'s place in its shard group is rank modulo the group's size."""
    if not s.shards:
        return numel(shape)
    group = shard_group_size(w, s)
    return shard_numel(shape, group, rank % group)


def _update_temporaries(w: Workload, s: Strategy, rank: int) -> int:
    """Temporaries of torch's AdamW update, by the implementation torch picks.

    Fused (a CUDA lever): none. On CUDA torch defaults to the multi-tensor (foreach) update, whose square
    root of exp_avg_sq is one fp32 list the size of all parameters. On the CPU (and for an offloaded
    update, which runs there, unfused) torch defaults to the per-tensor update: sqrt and the division by the
    bias correction make two fp32 temporaries of one tensor at a time, the largest one setting the peak.
    """
    if w.fused_adamw and not s.offloads:
        return 0
    sizes = [_held_numel(shape, s, w, rank) for shape in parameter_shapes(w.model).values()]
    if w.device == "cpu" or s.offloads:
        return 2 * FP32 * max(sizes)
    return FP32 * sum(sizes)


def _compute_bytes(w: Workload, s: Strategy) -> int:
    """Bytes per element of the parameters as a matmul reads them: FSDP's policy casts the parameters it
    gathers (the sharding strategies) to the precision; autocast leaves the kept ones fp32."""
    return DTYPE_BYTES[w.precision] if s.shards else FP32


def _root_grads_whole(w: Workload, s: Strategy, rank: int, compute: int) -> int:
    """What the root unit's gradients other than the token embedding's add at the embedding's sum under a
    sharding strategy: they are whole, in the compute dtype, until the root's reduce-scatter that follows,
    instead of the rank's fp32 shard counted in the model state."""
    if not s.shards:
        return 0
    shapes = parameter_shapes(w.model)
    return sum(
        compute * numel(shapes[name]) - FP32 * _held_numel(shapes[name], s, w, rank)
        for name in _root_names(w.model)
        if name != WTE
    )


def _wte_share(w: Workload, s: Strategy, rank: int) -> int:
    return _held_numel((w.model.vocab_size, w.model.n_embd), s, w, rank)


def entry(strategy: str | Strategy) -> Strategy:
    """The registry entry of a strategy name (an entry is taken as it is); ValueError for a name it lacks."""
    if isinstance(strategy, Strategy):
        return strategy
    found = registry.find(strategy)
    if found is None:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(registry.names())}")
    return found


def checked(strategy: str | Strategy, w: Workload) -> Strategy:
    """The entry, refused when the workload spreads a one-process strategy over several devices."""
    s = entry(strategy)
    if not s.multi_process and w.world_size != 1:
        raise ValueError(f"the {s.name} strategy runs on one device: world_size must be 1")
    return s


def max_micro_batch_size(w: Workload, strategy: str | Strategy, budget_bytes: float, limit: int = 4096) -> int:
    """The largest micro-batch whose predicted peak fits `budget_bytes` (0 when not even 1 fits)."""
    s = entry(strategy)

    def fits(b: int) -> bool:
        return step_memory(_with(w, micro_batch_size=b), s).total <= budget_bytes

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:  # fits(low) and not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _with(w: Workload, **changes: Any) -> Workload:
    return Workload(**{**w.__dict__, **changes})


# ---------------------------------------------------------------------------------------------------
# Step time


# The offloaded update is torch's per-tensor AdamW (torch/optim/adam.py, _single_tensor_adam, non-capturable
# path: on the CPU torch picks neither the fused nor the foreach update), one element-wise pass at a time
# over fp32 tensors. Bytes read and written per element by each pass:
ADAMW_HOST_PASSES: tuple[tuple[str, int], ...] = (
    ("exp_avg.lerp_(grad, 1 - beta1)", 12),  # reads exp_avg and grad, writes exp_avg
    ("exp_avg_sq.mul_(beta2)", 8),
    ("exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)", 12),  # grad read once: both operands are one tensor
    ("exp_avg_sq.sqrt()", 8),  # a new tensor: denom
    ("denom / bias_correction2_sqrt", 8),  # another new tensor
    ("denom.add_(eps)", 8),
    ("param.addcdiv_(exp_avg, denom, value=-step_size)", 16),
)
# Decoupled weight decay, one more pass, on the tensors training/step.py decays (those of 2 or more dims).
ADAMW_HOST_DECAY_PASS = ("param.mul_(1 - lr * weight_decay)", 8)
# accelerate launch sets OMP_NUM_THREADS=1 in every process it starts (one core each), so the update runs
# on one core: the rate below is one core's, for these passes (the compute of sqrt, lerp and addcdiv
# included), not the socket's memory bandwidth. 10 GB/s is assumed for a cloud vCPU; a 2-core development
# VM measured 13 GB/s for a single 8M-element tensor (lab/results/planning_checks.md).
HOST_UPDATE_CORE_GB_S = 10.0


# A collective's per-call cost on a GPU link when none was measured (alpha of the alpha-beta model): NCCL's
# small-message all-reduce between two GPUs of one machine takes about 10-30 us (nccl-tests, 8-byte
# all_reduce_perf), and the wrapper's launch of it (DDP's bucket hook, FSDP2's copy-in and copy-out) adds
# some; 30 us is assumed. A multi-process run measures its own (planner/link.py, `latency_s`).
GPU_COLLECTIVE_LATENCY_S = 30e-6
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the first bucket rebuilt is 1 MiB


@dataclass(frozen=True)
class Link:
    gb_s: float  # all-reduce bus bandwidth between the devices, 10^9 bytes per second
    host_gb_s: float = 12.0  # host <-> device copies (FSDP offload), PCIe 3.0/4.0 x16 in practice
    host_update_gb_s: float = HOST_UPDATE_CORE_GB_S  # one host core's rate over the AdamW passes, bytes/s / 1e9
    # A machine's network bandwidth to the others (all its ports together), 10^9 bytes/s; None on one machine.
    # A ring collective over the devices of several machines reaches about this bus bandwidth (each ring
    # crosses a machine's boundary once per direction): it runs at the slower of the two links. Hybrid
    # sharding sends only its replicas' all-reduce over it, every device of the machine at once.
    inter_node_gb_s: float | None = None
    latency_s: float = GPU_COLLECTIVE_LATENCY_S  # per collective call, whatever its size (alpha)
    # FSDP's own collectives, where a run measured them (planner/link.py `sharded_calls`); None: priced as
    # the all-reduce is (`gb_s`, `latency_s`). The bandwidths are bus bandwidths, 10^9 bytes/s, of an
    # all-gather and a reduce-scatter of the run's message ((N-1)/N of it over each link); the latencies are
    # seconds per call of one FSDP2 unit's all-gather and reduce-scatter as FSDP2 issues them: the copy-in
    # and copy-out around the call and the unit's hooks included, which a bare collective does not pay.
    gather_gb_s: float | None = None
    gather_latency_s: float | None = None  # per all-gather of a unit resharded after forward (2 a micro-step)
    scatter_gb_s: float | None = None
    scatter_latency_s: float | None = None
    # Per all-gather of a unit kept gathered after forward (fsdp_zero2's blocks, every root): its one gather a
    # micro-step carries all of its hooks, where a resharded unit's two share them. None: `gather_latency_s`.
    kept_gather_latency_s: float | None = None
    # The processes and machines the measured all-gather and reduce-scatter spanned: their bandwidths price
    # only a shard group that spans the same (`sharded_span`), any other is priced at the all-reduce's.
    sharded_span: tuple[int, int] | None = None

    def seconds(self, bus_bytes: float, calls: int, gb_s: float | None = None, latency_s: float | None = None) -> float:
        """The alpha-beta time of `calls` collectives moving `bus_bytes` per device in all: a per-call latency
        (`latency_s`, the all-reduce's unless given) plus the bytes over the bus bandwidth (`gb_s`, the device
        link's unless given)."""
        if calls == 0:
            return 0.0
        alpha = self.latency_s if latency_s is None else latency_s
        return calls * alpha + bus_bytes / ((gb_s or self.gb_s) * 1e9)

    def scaled(self, factor: float) -> Link:
        """Every bandwidth between devices times `factor` (the planner's corners of the link's uncertainty)."""
        return replace(
            self,
            gb_s=self.gb_s * factor,
            inter_node_gb_s=None if self.inter_node_gb_s is None else self.inter_node_gb_s * factor,
            gather_gb_s=None if self.gather_gb_s is None else self.gather_gb_s * factor,
            scatter_gb_s=None if self.scatter_gb_s is None else self.scatter_gb_s * factor,
        )


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    communication_s: float  # collectives between devices, and host copies and the CPU update for offload
    exposed_s: float  # communication not hidden behind compute
    communication_bytes: float  # bytes each device sends per step
    # Hidden however the run is configured: DDP's bucketed all-reduce runs during the backward by
    # construction (its gradient hooks), while FSDP hides its collectives only by prefetching.
    built_in_hidden_s: float = 0.0
    collective_calls: int = 0  # collectives each device takes part in per step (each pays the latency)
    # The optimizer's update where it runs on the same core as the compute (a CPU run; an offloaded update is
    # in communication_s instead): never overlapped.
    update_s: float = 0.0

    @property
    def step_s(self) -> float:
        """Each strategy overlapping as far as it can (DDP's buckets, FSDP's prefetch): `--overlap full`."""
        return self.compute_s + self.exposed_s + self.update_s

    @property
    def step_s_without_prefetch(self) -> float:
        """DDP still overlapped, FSDP's collectives waited for (prefetching off): `--overlap none`."""
        return self.compute_s + self.communication_s - self.built_in_hidden_s + self.update_s

    @property
    def step_s_no_overlap(self) -> float:
        """Nothing hidden at all: an upper bound for every strategy."""
        return self.compute_s + self.communication_s + self.update_s


@dataclass(frozen=True)
class Schedule:
    """The step's collectives as they run: seconds in all, the seconds no compute hid, bytes and calls."""

    seconds: float
    exposed_s: float
    bytes: float
    calls: int


NO_COLLECTIVES = Schedule(0.0, 0.0, 0.0, 0)


def step_time(w: Workload, strategy: str | Strategy, peak_flops: float, mfu: float, link: Link) -> StepTime:
    """Compute at `mfu` of `peak_flops`, plus the step's collectives over `link`, overlapped as the schedule of
    each strategy under accumulation allows (docs/design/planning_model.md, "Step time").

    Each collective costs `link.seconds`: a per-call latency plus its ring bytes over the bus bandwidth (an
    all-reduce sends 2(N-1)/N of the buffer from every device, an all-gather or a reduce-scatter (N-1)/N).
    Under accumulation the gradient collectives (DDP's all-reduce, FSDP's reduce-scatter, HSDP's replica
    all-reduce) run only in the last micro-step's backward, so only that backward can hide them, while
    FSDP's all-gathers run in every micro-step, each behind that micro-step's compute. What is ready only
    after the last compute (DDP's tied-embedding bucket, FSDP's root unit) is always exposed. On a CPU every
    core computes (one process per core), so nothing overlaps, and the AdamW update runs on the same core.
    """
    s = checked(strategy, w)
    cfg = w.model
    tokens = w.micro_batch_size * w.block_size * w.grad_accum_steps
    recompute = 4 / 3 if w.activation_checkpointing else 1.0  # one more forward: 2N of the 6N per token
    compute_s = tokens * flops_per_token(cfg, w.block_size) * recompute / (mfu * peak_flops)
    # The backward's share of a micro-step: 4N of 6N FLOPs per token, 6N of 8N with the recomputed forward.
    micro_step_s = compute_s / w.grad_accum_steps
    backward_s = micro_step_s * (3 / 4 if w.activation_checkpointing else 2 / 3)
    if w.device == "cpu":  # one process per core: a collective needs the core its compute has
        micro_step_s = backward_s = 0.0
    inside = _collectives(w, s, link, micro_step_s, backward_s)
    across = _replica_all_reduce(w, s, link, backward_s)
    host_s = _offload_seconds(w, s, total_parameters(cfg), link)
    update_s = host_update_bytes(w, s) / (link.host_update_gb_s * 1e9) if w.device == "cpu" and not s.offloads else 0
    hidden = inside.seconds - inside.exposed_s
    built_in = hidden if s.communication is Communication.ALL_REDUCE else 0.0
    return StepTime(
        compute_s,
        inside.seconds + across.seconds + host_s,
        inside.exposed_s + across.exposed_s + host_s,
        inside.bytes + across.bytes,
        built_in,
        inside.calls + across.calls,
        update_s,
    )


def _backward_order(cfg: GPT2Config, block_size: int) -> list[tuple[list[str], float]]:
    """The units of backward in the order it runs them, each with the parameters whose gradients it completes
    and the fraction of the backward done when it ends: the output head (it computes, but the tied embedding's
    gradient is complete only at the end) with ln_f, each block from the last, then the embeddings' lookups
    (no compute). A unit's share is its FLOPs per token: 6 per parameter of its matmuls, 12 C T for a block's
    attention."""
    shapes = parameter_shapes(cfg)
    units = [([n for n in shapes if n.startswith("transformer.ln_f.")], 6.0 * numel(shapes[WTE]))]
    for layer in reversed(range(cfg.n_layer)):
        names = [n for n in reversed(shapes) if n.startswith(f"transformer.h.{layer}.")]  # last tensor first
        units.append((names, 6.0 * sum(numel(shapes[n]) for n in names) + 12.0 * cfg.n_embd * block_size))
    units.append(([n for n in shapes if n.startswith("transformer.w")], 0.0))  # wte and wpe
    total, done, order = sum(f for _, f in units), 0.0, []
    for names, flops in units:
        done += flops
        order.append((names, min(1.0, done / total)))
    return order


def ddp_buckets(cfg: GPT2Config, block_size: int) -> list[tuple[int, float]]:
    """DDP's gradient buckets as its reducer rebuilds them after the first step: fp32 gradients in the order
    backward completes them, a bucket closed once it holds 1 MiB (the first) or 25 MiB (the others); each as
    (bytes, the fraction of the backward done when its last gradient is ready)."""
    shapes = parameter_shapes(cfg)
    buckets: list[tuple[int, float]] = []
    size = 0
    for names, done in _backward_order(cfg, block_size):
        for name in names:
            size += numel(shapes[name]) * FP32
            if size >= (DDP_FIRST_BUCKET_BYTES if not buckets else DDP_BUCKET_BYTES):
                buckets.append((size, done))
                size = 0
    if size:
        buckets.append((size, 1.0))
    return buckets


def _queue_end(jobs: list[tuple[float, float]]) -> float:
    """When the last of `jobs` (ready time, seconds), run one after another on one link, is done."""
    end = 0.0
    for ready, seconds in jobs:
        end = max(end, ready) + seconds
    return end


def _collectives(w: Workload, s: Strategy, link: Link, micro_step_s: float, backward_s: float) -> Schedule:
    """The main collectives of a step over the devices (for hybrid sharding, those inside one machine).

    DDP: its buckets are all-reduced in the last micro-step's backward, each once ready, one after another;
    what is left when the backward ends is exposed (the tied embedding's bucket, ready last, always is).
    FSDP: every micro-step gathers the root unit before any compute (exposed) and each block once or twice
    (forward, and backward when resharded), prefetched behind that micro-step's compute; the last micro-step
    also reduce-scatters the blocks behind its compute, and the root after it (exposed).
    """
    n = shard_group_size(w, s)
    if s.communication is Communication.NONE or n == 1:
        return NO_COLLECTIVES
    share, gb_s = (n - 1) / n, _ring_gb_s(w, s, link, link.gb_s)
    if s.communication is Communication.ALL_REDUCE:
        buckets = ddp_buckets(w.model, w.block_size)
        jobs = [(done * backward_s, link.seconds(2 * share * size, 1, gb_s)) for size, done in buckets]
        seconds = sum(t for _, t in jobs)
        exposed = max(0.0, _queue_end(jobs) - backward_s)
        return Schedule(seconds, exposed, 2 * share * sum(size for size, _ in buckets), len(buckets))
    half, layers, gathers, a = DTYPE_BYTES[w.precision], w.model.n_layer, s.gathers_per_micro_step, w.grad_accum_steps
    root = sum(numel(parameter_shapes(w.model)[name]) for name in _root_names(w.model))
    blocks = layers * _block_numel(w.model)
    # Each kind at its own alpha-beta where the run measured it (FSDP2's per-unit call, the collective's own
    # bandwidth over a group that spans what this one does), else at the all-reduce's.
    own = link.sharded_span == sharded_span(w, s)
    gather_gb_s = _ring_gb_s(w, s, link, (link.gather_gb_s if own else None) or link.gb_s)
    scatter = (_ring_gb_s(w, s, link, (link.scatter_gb_s if own else None) or link.gb_s), link.scatter_latency_s)
    kept = link.kept_gather_latency_s or link.gather_latency_s  # the root always, the blocks of fsdp_zero2
    block_gather = (gather_gb_s, kept if gathers == 1 else link.gather_latency_s)
    root_gather_s = link.seconds(share * root * half, 1, gather_gb_s, kept)
    root_scatter_s = link.seconds(share * root * half, 1, *scatter)
    block_gathers_s = link.seconds(share * blocks * half * gathers, layers * gathers, *block_gather)
    block_scatters_s = link.seconds(share * blocks * half, layers, *scatter)
    seconds = a * (root_gather_s + block_gathers_s) + block_scatters_s + root_scatter_s
    exposed = (
        a * root_gather_s
        + (a - 1) * max(0.0, block_gathers_s - micro_step_s)
        + max(0.0, block_gathers_s + block_scatters_s - micro_step_s)
        + root_scatter_s
    )
    volume = share * half * (a * (root + gathers * blocks) + root + blocks)
    return Schedule(seconds, exposed, volume, a * (1 + layers * gathers) + layers + 1)


def _ring_gb_s(w: Workload, s: Strategy, link: Link, own_gb_s: float) -> float:
    """The bus bandwidth of one kind of the step's main collectives (_collectives), `own_gb_s` inside a
    machine: over all devices, at the slower link when they span machines; hybrid sharding's stay inside one."""
    hybrid = s.fsdp is not None and s.fsdp.hybrid
    if w.num_nodes == 1 or link.inter_node_gb_s is None or hybrid:
        return own_gb_s
    return min(own_gb_s, link.inter_node_gb_s)


def _replica_all_reduce(w: Workload, s: Strategy, link: Link, backward_s: float) -> Schedule:
    """Hybrid sharding, in the last micro-step: after each unit's reduce-scatter inside the machine, every
    device all-reduces that unit's gradient shard (in the policy's dtype) with the devices holding the same
    shard on the other machines, all G devices of a machine at once through its network. FSDP2 issues each
    unit's all-reduce as its backward ends, so it overlaps the backward of the units before it; the root's,
    after the last compute, is always exposed."""
    replicas = w.num_nodes
    if s.communication is not Communication.HYBRID or replicas == 1:
        return NO_COLLECTIVES
    group = shard_group_size(w, s)
    gb_s = (link.inter_node_gb_s or link.gb_s) / group  # the machine's network, shared by its G devices
    shapes, half = parameter_shapes(w.model), DTYPE_BYTES[w.precision]
    root = sum(numel(shapes[name]) for name in _root_names(w.model))
    # The blocks' all-reduces as each block's backward ends, then the root's after the last compute.
    units = [(sum(numel(shapes[n]) for n in names), done) for names, done in _backward_order(w.model, w.block_size)]
    units = [(size, done) for size, done in units[1:-1]] + [(root, 1.0)]
    sent = [2 * (replicas - 1) / replicas * size / group * half for size, _ in units]
    jobs = [(done * backward_s, link.seconds(b, 1, gb_s)) for b, (_, done) in zip(sent, units)]
    volume = sum(sent)
    seconds = sum(t for _, t in jobs)
    return Schedule(seconds, max(0.0, _queue_end(jobs) - backward_s), volume, len(jobs))


def _offload_seconds(w: Workload, s: Strategy, params: int, link: Link) -> float:
    """Host copies and the CPU's AdamW update of an offloading strategy; the GPU waits for both."""
    if not s.offloads:
        return 0.0
    local = params / shard_group_size(w, s)
    # FSDP2 copies the fp32 shard to the device at each all-gather (gathers per micro-step x accumulation) and
    # the gradients back to the host once per step, after the reduce-scatter that follows the last micro-step.
    # On a CPU run the "device" is the host: those copies move nothing.
    copies = (w.grad_accum_steps * s.gathers_per_micro_step + 1) * local * FP32 / (link.host_gb_s * 1e9)
    copies = 0.0 if w.device == "cpu" else copies
    return copies + host_update_bytes(w, s) / (link.host_update_gb_s * 1e9)


def host_update_bytes(w: Workload, strategy: str | Strategy, rank: int = 0) -> int:
    """Bytes the per-tensor AdamW update reads and writes on `rank`'s host core (ADAMW_HOST_PASSES): 72 per
    element of its shard, 80 for the decayed matrices."""
    s = entry(strategy)
    per_element = sum(b for _, b in ADAMW_HOST_PASSES)
    total = 0
    for shape in parameter_shapes(w.model).values():
        held = _held_numel(shape, s, w, rank)
        total += held * (per_element + (ADAMW_HOST_DECAY_PASS[1] if len(shape) >= 2 else 0))
    return total

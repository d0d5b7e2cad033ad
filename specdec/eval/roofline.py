"""The roofline of one engine step: the least time a decode or verify step of a model can take on a device, from the
bytes it must move and the GEMM FLOPs it must do, against the device's copy bandwidth and GEMM throughput measured
in the same run (specdec/eval/peaks.py). Every end-to-end table puts the measured ms/step beside it.

A step is B requests, T nodes each (T = 1: plain decoding; speculative: the root and the drafted nodes), of which
`accepted` tokens per request are kept (the mean accepted length, bonus token included). Per op:

    time = max(bytes / copy bandwidth, FLOPs / GEMM peak),    step time = the sum over ops

with one op per weight matrix and per kind of cache traffic, so a profile can be held against the breakdown
(`Roofline.ms_by_part`). What each op counts (N = B T tokens; w = bytes of the model dtype; states and buffer
entries fp32, as the pools hold them):

- GEMMs (part "weights", "LM head"): the weight once, its N input and N output rows; 2 N in out FLOPs.
  Mixture of experts ("MoE experts"): the distinct experts that N tokens routed uniformly to k of E touch,
  E (1 - (1 - k/E)^N) in expectation, each read once, times Workload.expert_factor (1, or what a run measured
  against that expectation: specdec/models/expert_traffic.py); 2 N k in out FLOPs. Routers and shared experts are
  GEMMs.
- Linear-attention state per layer ("linear state"), S = one request's state, e = one buffered token's entry:
  * KVBuffer with flush length L: S0 read once per row that has a state (a request that has never folded has
    none: context < L), the buffer's entries read once per row (mean fill (L - a) / 2 for a tokens kept per step),
    entries written (plain: one; speculative: T, then the a kept ones gathered into the buffer, read + write), and
    the fold amortised: a/L of the rows per step read S0, read L entries and write S0.
  * Intermediate states (the baseline, `recurrent`): plain decoding reads and writes S in place; speculative reads
    S, writes one state per node (T S) and copies the accepted node's state back (read + write).
  FLOPs: the S0 products (GDN: S^T k and S^T q, 4 per state element and node; Mamba2: h C, 2) and the fold's rank
  updates (2 L per state element); they are fp32 on the CUDA cores, an intensity of a few FLOPs per byte, so these
  ops are bound by their bytes whatever peak they are held against.
- Conv windows ("conv"): each linear layer reads and writes the W - 1 committed pre-conv inputs of every row.
- Attention ("attention KV"): the committed K/V of each row read once for all its nodes (context tokens), the
  nodes' K/V written, and (speculative) the kept ones moved (read + write); 4 N heads head_dim (context + T) FLOPs.
- Embedding rows read and written; LM head logits written by the GEMM and read once by sampling ("LM head").

Not counted: the glue between GEMMs (norms, activations, residual adds, rotary, the mixers' fp32 inputs), taken as
fused into its neighbours; the drafter's own forward (the study's synthetic drafter has none); prefill; the host.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from specdec.eval.peaks import Peaks

BACKENDS = ("kvbuffer", "recurrent")
STATE_BYTES = 4  # states and buffer entries are fp32 in the pools
PARTS = ("weights", "MoE experts", "linear state", "conv", "attention KV", "LM head", "embedding")


@dataclass(frozen=True)
class Workload:
    """One step: `batch` requests of `nodes` tokens each, `accepted` tokens kept per request (1 for plain)."""

    batch: int
    nodes: int = 1              # T: 1 for plain decoding; 1 + drafted nodes when verifying
    accepted: float = 1.0       # a: mean tokens kept per request per step, bonus included
    backend: str = "kvbuffer"   # kvbuffer | recurrent (the intermediate-state baseline)
    flush_length: int = 16      # L of the KVBuffer (the baseline keeps no buffer)
    context: float = 0.0        # committed tokens per request: the attention KV read, and whether a state exists
    dtype_bytes: int = 2        # weights, activations, KV and conv windows (bf16)
    expert_factor: float = 1.0  # MoE: distinct experts read / those uniform routing touches (measured by a run)

    def __post_init__(self):
        if self.batch < 1 or self.nodes < 1 or self.flush_length < 1:
            raise ValueError(f"batch, nodes and flush_length must be >= 1, got {self}")
        if not 1.0 <= self.accepted <= self.nodes:
            raise ValueError(f"accepted must be in [1, nodes={self.nodes}], got {self.accepted}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")

    @property
    def tokens(self) -> int:
        return self.batch * self.nodes

    @property
    def speculative(self) -> bool:
        return self.nodes > 1


@dataclass(frozen=True)
class Op:
    """`count` identical instances (one per layer) of an op moving `bytes` and doing `flops` each."""

    part: str
    name: str
    bytes: float
    flops: float = 0.0
    count: int = 1
    params: int = 0   # elements of the weight it reads from (all experts of a MoE), for weight_elements

    def seconds(self, peaks: Peaks) -> float:
        return self.count * max(self.bytes / peaks.copy_bytes_per_second, self.flops / peaks.gemm_flops_per_second)


@dataclass(frozen=True)
class Roofline:
    ops: tuple[Op, ...]
    peaks: Peaks

    @property
    def ms_per_step(self) -> float:
        return 1e3 * sum(op.seconds(self.peaks) for op in self.ops)

    def ms_by_part(self) -> dict[str, float]:
        parts: dict[str, float] = defaultdict(float)
        for op in self.ops:
            parts[op.part] += 1e3 * op.seconds(self.peaks)
        return {part: parts[part] for part in PARTS if part in parts}

    def ms_by_op(self) -> dict[str, float]:
        """'part: op name' -> ms per step, all its layers."""
        ops: dict[str, float] = defaultdict(float)
        for op in self.ops:
            ops[f"{op.part}: {op.name}"] += 1e3 * op.seconds(self.peaks)
        return dict(ops)


def roofline(config, work: Workload, peaks: Peaks) -> Roofline:
    """The roofline of one step of the model `config` (a transformers config: Qwen3.5 dense or MoE, text or
    multimodal, or Nemotron-H) under `work`."""
    return Roofline(tuple(step_ops(config, work)), peaks)


def step_ops(config, work: Workload) -> list[Op]:
    config = text_config(config)
    if config.model_type == "nemotron_h":
        ops = nemotron_ops(config, work)
    elif config.model_type.startswith("qwen3_5"):
        ops = qwen35_ops(config, work, moe="moe" in config.model_type)
    else:
        raise ValueError(f"no roofline for model_type {config.model_type!r}; known: qwen3_5*, nemotron_h")
    hidden, vocab, w = config.hidden_size, config.vocab_size, work.dtype_bytes
    n = work.tokens
    return [Op("embedding", "embedding rows", 2 * n * hidden * w), *ops,
            gemm("LM head", "lm_head", hidden, vocab, work),
            Op("LM head", "logits read by sampling", n * vocab * w)]


def text_config(config):
    """A multimodal Qwen3.5 config's text part (the model we serve), else the config itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def merge_counts(ops: list[Op]) -> list[Op]:
    """Identical ops of several layers as one op with their count."""
    merged: dict[Op, int] = {}
    for op in ops:
        key = replace(op, count=1)
        merged[key] = merged.get(key, 0) + op.count
    return [replace(op, count=count) for op, count in merged.items()]


# ---- layers ----------------------------------------------------------------------------------------------------

def gemm(part: str, name: str, fan_in: int, fan_out: int, work: Workload, weight_bytes: int | None = None) -> Op:
    """x [N, fan_in] @ W^T [fan_in, fan_out]: the weight once, the activations in and out."""
    n, w = work.tokens, work.dtype_bytes
    weight = fan_in * fan_out * (weight_bytes or w)
    return Op(part, name, weight + n * (fan_in + fan_out) * w, 2 * n * fan_in * fan_out, params=fan_in * fan_out)


def experts(name: str, num_experts: int, top_k: int, fan_in: int, fan_out: int, work: Workload) -> Op:
    """One grouped GEMM over the routed experts: the distinct experts touched, expected under uniform routing (times
    the measured factor, at most all of them)."""
    n, w = work.tokens, work.dtype_bytes
    touched = min(expected_experts(num_experts, top_k, n) * work.expert_factor, num_experts)
    return Op("MoE experts", name, touched * fan_in * fan_out * w + n * top_k * (fan_in + fan_out) * w,
              2 * n * top_k * fan_in * fan_out, params=num_experts * fan_in * fan_out)


def expected_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts hit by `tokens` tokens each routed to top_k of num_experts, uniformly: E (1 - (1 - k/E)^N)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def attention_ops(work: Workload, hidden: int, heads: int, kv_heads: int, head_dim: int, gated: bool) -> list[Op]:
    q_out = heads * head_dim * (2 if gated else 1)  # Qwen3.5's q_proj also yields the output gate
    kv = kv_heads * head_dim
    per_token = 2 * kv * work.dtype_bytes  # K and V of one token
    b, t, a = work.batch, work.nodes, work.accepted
    moved = 2 * b * a * per_token if work.speculative else 0.0  # the kept nodes' K/V to consecutive positions
    return [gemm("weights", "attention q_proj", hidden, q_out, work),
            gemm("weights", "attention k_proj", hidden, kv, work),
            gemm("weights", "attention v_proj", hidden, kv, work),
            gemm("weights", "attention o_proj", heads * head_dim, hidden, work),
            Op("attention KV", "KV read, nodes written", b * work.context * per_token + b * t * per_token + moved,
               4 * b * t * heads * head_dim * (work.context + t))]


def linear_state_ops(work: Workload, mixer: str, state: int, entry: int, flops_per_element: int,
                     conv_dim: int, conv_width: int) -> list[Op]:
    """The state, buffer and conv-window traffic of one linear-attention layer; `state` and `entry` in elements
    (one request's state; one buffered token's key, value and decay), fp32."""
    b, t, a, L = work.batch, work.nodes, work.accepted, work.flush_length
    s, e = state * STATE_BYTES, entry * STATE_BYTES
    node_flops = flops_per_element * state * t
    ops = [Op("conv", f"{mixer} conv windows", 2 * b * (conv_width - 1) * conv_dim * work.dtype_bytes)]
    if work.backend == "recurrent":
        if not work.speculative:
            return ops + [Op("linear state", f"{mixer} state read + written in place", 2 * b * s, b * node_flops)]
        return ops + [Op("linear state", f"{mixer} state read", b * s, b * node_flops),
                      Op("linear state", f"{mixer} one state written per node", b * t * s),
                      Op("linear state", f"{mixer} accepted state copied back", 2 * b * s)]
    has_state = work.context >= L  # a request that has never folded its buffer has no state to read
    fill = max(L - a, 0.0) / 2  # mean buffered entries before a step
    written = b * t * e + 2 * b * a * e if work.speculative else b * e
    folding = b * min(a / L, 1.0)  # rows that fold per step
    if has_state:
        ops.append(Op("linear state", f"{mixer} S0 read", b * s, b * node_flops))
    return ops + [Op("linear state", f"{mixer} buffer read", b * fill * e),
                  Op("linear state", f"{mixer} entries written", written),
                  Op("linear state", f"{mixer} fold (amortised)", folding * ((2 if has_state else 1) * s + L * e),
                     folding * 2 * L * state)]


def gdn_ops(config, work: Workload) -> list[Op]:
    hidden = config.hidden_size
    heads, v_heads = config.linear_num_key_heads, config.linear_num_value_heads
    k_dim, v_dim = config.linear_key_head_dim, config.linear_value_head_dim
    key, value = heads * k_dim, v_heads * v_dim
    conv_dim = 2 * key + value
    return [gemm("weights", "gdn in_proj_qkv", hidden, conv_dim, work),
            gemm("weights", "gdn in_proj_z", hidden, value, work),
            gemm("weights", "gdn in_proj_b", hidden, v_heads, work),
            gemm("weights", "gdn in_proj_a", hidden, v_heads, work),
            gemm("weights", "gdn out_proj", value, hidden, work),
            *linear_state_ops(work, "gdn", state=v_heads * k_dim * v_dim, entry=key + value + v_heads,
                              flops_per_element=4, conv_dim=conv_dim, conv_width=config.linear_conv_kernel_dim)]


def mamba2_ops(config, work: Workload) -> list[Op]:
    hidden = config.hidden_size
    heads, head_dim, groups, n = config.mamba_num_heads, config.mamba_head_dim, config.n_groups, config.ssm_state_size
    inner = heads * head_dim
    conv_dim = inner + 2 * groups * n
    return [gemm("weights", "mamba2 in_proj", hidden, inner + conv_dim + heads, work),
            gemm("weights", "mamba2 out_proj", inner, hidden, work),
            *linear_state_ops(work, "mamba2", state=heads * head_dim * n, entry=groups * n + inner + heads,
                              flops_per_element=2, conv_dim=conv_dim, conv_width=config.conv_kernel)]


# ---- models ----------------------------------------------------------------------------------------------------

def qwen35_ops(config, work: Workload, moe: bool) -> list[Op]:
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    ops = []
    for layer_type in list(config.layer_types)[: config.num_hidden_layers]:
        if layer_type == "linear_attention":
            ops += gdn_ops(config, work)
        else:
            ops += attention_ops(work, hidden, config.num_attention_heads, config.num_key_value_heads, head_dim,
                                 gated=True)
        ops += qwen35_moe_ops(config, work) if moe else gated_mlp_ops("mlp", hidden, config.intermediate_size, work)
    return merge_counts(ops)


def gated_mlp_ops(name: str, hidden: int, intermediate: int, work: Workload) -> list[Op]:
    return [gemm("weights", f"{name} gate_proj", hidden, intermediate, work),
            gemm("weights", f"{name} up_proj", hidden, intermediate, work),
            gemm("weights", f"{name} down_proj", intermediate, hidden, work)]


def qwen35_moe_ops(config, work: Workload) -> list[Op]:
    hidden, experts_, k, inner = (config.hidden_size, config.num_experts, config.num_experts_per_tok,
                                  config.moe_intermediate_size)
    return [gemm("weights", "moe router", hidden, experts_, work),
            experts("experts gate_up_proj", experts_, k, hidden, 2 * inner, work),
            experts("experts down_proj", experts_, k, inner, hidden, work),
            *gated_mlp_ops("shared expert", hidden, config.shared_expert_intermediate_size, work),
            gemm("weights", "shared expert gate", hidden, 1, work)]


def nemotron_ops(config, work: Workload) -> list[Op]:
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    ops = []
    for block in config.layers_block_type:
        if block == "linear_attention":
            ops += mamba2_ops(config, work)
        elif block == "full_attention":
            ops += attention_ops(work, hidden, config.num_attention_heads, config.num_key_value_heads, head_dim,
                                 gated=False)
        elif block == "mlp":
            ops += plain_mlp_ops("mlp", hidden, config.intermediate_size, work)
        elif block == "moe":
            ops += nemotron_moe_ops(config, work)
        else:
            raise ValueError(f"no roofline for Nemotron-H block {block!r}")
    return merge_counts(ops)


def plain_mlp_ops(name: str, hidden: int, intermediate: int, work: Workload) -> list[Op]:
    return [gemm("weights", f"{name} up_proj", hidden, intermediate, work),
            gemm("weights", f"{name} down_proj", intermediate, hidden, work)]


def nemotron_moe_ops(config, work: Workload) -> list[Op]:
    hidden, experts_, k = config.hidden_size, config.n_routed_experts, config.num_experts_per_tok
    latent = getattr(config, "moe_latent_size", None)
    width = latent or hidden  # the experts' input and output width
    ops = [gemm("weights", "moe router (fp32)", hidden, experts_, work, weight_bytes=STATE_BYTES),
           experts("experts up_proj", experts_, k, width, config.moe_intermediate_size, work),
           experts("experts down_proj", experts_, k, config.moe_intermediate_size, width, work),
           *plain_mlp_ops("shared expert", hidden, config.moe_shared_expert_intermediate_size, work)]
    if latent:
        ops += [gemm("weights", "moe fc1_latent_proj", hidden, latent, work),
                gemm("weights", "moe fc2_latent_proj", latent, hidden, work)]
    return ops


def weight_elements(config) -> int:
    """Every weight matrix the roofline reads from (all experts, the embedding and the LM head): the model's
    parameter count less norms, conv kernels and per-head vectors. A check that the config is read as built."""
    config = text_config(config)
    ops = step_ops(config, Workload(batch=1))
    return sum(op.count * op.params for op in ops) + config.vocab_size * config.hidden_size


def run_roofline(config, steps: list[Workload], peaks: Peaks, divide_by: int | None = None) -> tuple[float, dict]:
    """A run of steps, one workload each (the batch shrinking as requests finish, contexts growing): its roofline in
    ms per step, in all and by part, over `divide_by` steps (default: the number of steps), as the run's measured
    ms/step is taken."""
    total: dict[str, float] = defaultdict(float)
    for work in steps:
        for part, ms in roofline(config, work, peaks).ms_by_part().items():
            total[part] += ms
    count = max(divide_by or len(steps), 1)
    by_part = {part: ms / count for part, ms in total.items()}
    return sum(by_part.values()), by_part

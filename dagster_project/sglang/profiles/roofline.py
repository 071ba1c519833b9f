"""A roofline of Qwen3.6-27B on one GPU: decode step time vs running requests, and prefill time, from the GPU's
published bandwidth and tensor throughput (`constants`) and the model's shapes (its shipped config.json).

One decode step under NEXTN/MTP speculative decoding (topk 1, `steps` drafts, D = steps + 1 tokens verified per
request) is a verify forward of the target over b x D tokens, then `steps` + 1 forwards of the one MTP layer
(the draft chain and the draft extend after verify). Each forward takes the longer of:

- memory: the weights it reads once for the whole batch, at `weights_bandwidth_efficiency` of peak, plus what
  every request reads and writes on its own (its KV cache up to its context; its mamba state read once and, under
  speculative decoding, one state snapshot written per verified token), at `request_bandwidth_efficiency`;
- compute: 2 FLOPs per weight per token at dense tensor peak,

plus a fixed `step_overhead`. Prefill is compute-bound: 2 FLOPs per weight per prompt token at `prefill_mfu` of
dense peak. The efficiencies are assumptions or fitted (see `constants`); the rest is arithmetic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dagster_project.sglang import capacity
from dagster_project.sglang.profiles import constants

CONFIG_PATH = Path(__file__).resolve().parents[1] / "qwen3_6_27b" / "config.json"
BF16_BYTES = 2


@dataclass(frozen=True)
class ModelShapes:
    """Parameter counts of the language model by part, from its config (the vision encoder never decodes)."""

    layers: int  # per-layer weights of the target's 64 decoder layers (attention, GDN, MLP, norms)
    embedding: int  # the input embedding: gathered, not streamed
    lm_head: int  # untied: streamed once per forward
    mtp_layer: int  # the MTP block (a full-attention decoder layer and its input projection)

    @property
    def target_streamed(self) -> int:
        """Weights a target forward reads: every decoder layer and the LM head."""
        return self.layers + self.lm_head

    @property
    def draft_streamed(self) -> int:
        """Weights one MTP forward reads: its block and the shared LM head."""
        return self.mtp_layer + self.lm_head

    def weights_bytes(self, weights: str) -> float:
        """Bytes of the language model's weights: FP8 checkpoints keep the embedding and LM head in bf16."""
        quantized = self.layers + self.mtp_layer
        return quantized * _weight_bytes(weights) + (self.embedding + self.lm_head) * BF16_BYTES


def _weight_bytes(weights: str) -> float:
    if weights not in ("bf16", "fp8"):
        raise ValueError(f"unknown weights {weights!r}: bf16 or fp8")
    return 1.0 if weights == "fp8" else 2.0


@cache
def qwen3_6_27b_shapes(path: Path = CONFIG_PATH) -> ModelShapes:
    text = json.loads(path.read_text())["text_config"]
    hidden, inner = text["hidden_size"], text["intermediate_size"]
    heads, kv_heads, head_dim = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    gate = 2 if text.get("attn_output_gate") else 1  # the query projection also yields the output gate
    attention = hidden * heads * head_dim * gate + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    key = text["linear_num_key_heads"] * text["linear_key_head_dim"]
    value = text["linear_num_value_heads"] * text["linear_value_head_dim"]
    conv = (2 * key + value) * text["linear_conv_kernel_dim"]
    gdn = hidden * (2 * key + 2 * value) + hidden * 2 * text["linear_num_value_heads"] + conv + value * hidden
    mlp = 3 * hidden * inner
    types = text["layer_types"]
    full = sum(1 for t in types if t == "full_attention")
    layers = full * attention + (len(types) - full) * gdn + len(types) * mlp
    mtp = text.get("mtp_num_hidden_layers", 0) * (attention + mlp + 2 * hidden * hidden)
    vocab = text["vocab_size"] * hidden
    return ModelShapes(layers=layers, embedding=vocab, lm_head=vocab, mtp_layer=mtp)


@dataclass(frozen=True)
class Hardware:
    """One GPU's published figures (constants `<gpu>.*`)."""

    name: str
    bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    fp8_flops: float
    memory_gib: float  # what nvidia-smi shows: the capacity model sizes the pools from it

    @classmethod
    def from_constants(cls, gpu: str) -> Hardware:
        c = constants.value
        return cls(
            name=gpu.upper(),
            bandwidth=c(f"{gpu}.hbm_bandwidth") * 1e12,
            bf16_flops=c(f"{gpu}.bf16_dense") * 1e12,
            fp8_flops=c(f"{gpu}.fp8_dense") * 1e12,
            memory_gib=c(f"{gpu}.memory_visible"),
        )

    def flops(self, weights: str) -> float:
        return self.fp8_flops if weights == "fp8" else self.bf16_flops


GPUS = ("h200", "b200")


@dataclass(frozen=True)
class Efficiency:
    """How much of the peaks a serving engine reaches (constants: assumptions and a fitted value)."""

    weights_bandwidth: float
    request_bandwidth: float
    step_overhead_s: float
    prefill_mfu: float

    @classmethod
    def from_constants(cls) -> Efficiency:
        c = constants.value
        return cls(
            weights_bandwidth=c("weights_bandwidth_efficiency"),
            request_bandwidth=c("request_bandwidth_efficiency"),
            step_overhead_s=c("step_overhead"),
            prefill_mfu=c("prefill_mfu"),
        )


@dataclass(frozen=True)
class Workload:
    """What a decode step depends on beyond the batch: weights, caches, speculative settings, context."""

    weights: str = "bf16"  # bf16 | fp8
    kv_cache_dtype: str = "fp8_e4m3"
    mamba_ssm_dtype: str = "float32"
    spec_steps: int = 3  # NEXTN drafts per pass (topk 1); 0: no speculative decoding
    context_tokens: float = 1800.0  # mean context a running request's decode reads

    @property
    def verified_tokens(self) -> int:
        """Tokens per request a verify forward processes: the drafts plus the one it samples itself."""
        return self.spec_steps + 1


@dataclass(frozen=True)
class Roofline:
    hardware: Hardware
    efficiency: Efficiency
    shapes: ModelShapes
    model: capacity.HybridModel = capacity.QWEN3_6_27B

    def _forward_s(self, weights_streamed: float, request_bytes: float, flops: float, weights: str) -> float:
        hw, eff = self.hardware, self.efficiency
        memory = weights_streamed / (eff.weights_bandwidth * hw.bandwidth) + request_bytes / (
            eff.request_bandwidth * hw.bandwidth
        )
        return max(memory, flops / hw.flops(weights))

    def request_bytes(self, work: Workload) -> float:
        """Bytes one running request moves per decode step: its KV cache, its mamba state and snapshots."""
        speculative = work.spec_steps > 0
        kv = work.context_tokens * self.model.kv_bytes_per_token(work.kv_cache_dtype, speculative)
        state = self.model.state_bytes_per_slot(work.mamba_ssm_dtype)
        writes = work.verified_tokens if speculative else 1  # one snapshot per verified token for rollback
        return kv + state * (1 + writes)

    def decode_step_s(self, running: int, work: Workload) -> float:
        """Seconds of one decode step (a verify pass and its drafts) with `running` requests."""
        shapes, per_weight = self.shapes, _weight_bytes(work.weights)
        lm_head = shapes.lm_head * (BF16_BYTES - per_weight)  # the LM head stays bf16 in an FP8 checkpoint
        tokens = running * work.verified_tokens
        target = self._forward_s(
            shapes.target_streamed * per_weight + lm_head,
            running * self.request_bytes(work),
            2.0 * shapes.target_streamed * tokens,
            work.weights,
        )
        draft = 0.0
        if work.spec_steps:
            # Each MTP forward reads its block and the LM head, and a context's worth of its own KV per request.
            layer_kv = self.model.kv_bytes_per_token(work.kv_cache_dtype, False) / self.model.full_attention_layers
            mtp_kv = work.context_tokens * layer_kv * self.model.draft_layers
            one = self._forward_s(
                shapes.draft_streamed * per_weight + lm_head,
                running * mtp_kv,
                2.0 * shapes.draft_streamed * running,
                work.weights,
            )
            draft = (work.spec_steps + 1) * one
        return self.efficiency.step_overhead_s + target + draft

    def prefill_s_per_token(self, work: Workload) -> float:
        """Seconds of prefill per prompt token: compute-bound, the target and (speculative) the MTP layer."""
        per_token = self.shapes.target_streamed + (self.shapes.mtp_layer if work.spec_steps else 0)
        return 2.0 * per_token / (self.efficiency.prefill_mfu * self.hardware.flops(work.weights))


def roofline_for(gpu: str, efficiency: Efficiency | None = None) -> Roofline:
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}: one of {', '.join(GPUS)}")
    return Roofline(Hardware.from_constants(gpu), efficiency or Efficiency.from_constants(), qwen3_6_27b_shapes())

"""The engine's own forward for Llama-family models on a CPU in float32 or bfloat16: transformers' arithmetic
without its module tree.

On a CPU at a small batch a decode step spends more time in Python than in arithmetic: transformers' decoder layer
is a dozen modules and some sixty torch operations, each a call through the dispatcher. This forward reads the
same weights from the same modules and, per layer, makes one call for the residual add and norm, the linear
layers' own calls, one for rotary embedding and the K/V writes, the attention, and one for SiLU(gate) * up
(engine/cpu/csrc/layer_ops.c, each following transformers' operations in order; in bfloat16 each result is rounded
where torch rounds it). Greedy tokens stay those of transformers' generate (tests/engine/test_cpu_forward.py).

Used where the CPU plan (engine.cpu.plan) chooses it: LlamaForCausalLM and Qwen2ForCausalLM (SmolLM2, Llama 2/3,
Qwen2.5 and their kin) in float32 or bfloat16 on a CPU; a model of another activation or an odd head size, or a
machine where the ops do not build, keeps transformers' forward, and the plan records why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.cpu.kernel_build import KernelBuildError, LayerOps, build_layer_ops
from engine.cpu.packed_linear import PackedLinear
from engine.cpu.plan import CpuPlan, Decision, Forward
from engine.model.attention import AttentionMetadata, attend, scales
from engine.model.fidelity import ModelFeatures
from engine.model.kv_cache import store

__all__ = ["CpuForward", "cpu_forward"]

MAX_ROTATED = 256  # the widest key row layer_ops.c's int8 write rotates (engine.model.kv_cache.rotate)

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: torch.Tensor
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    post_norm: torch.Tensor
    gate: Linear
    up: Linear
    down: Linear


class CpuForward:
    """Called by the runner once per step in place of the model: input ids and positions [T] and the step's
    attention metadata in, logits of the rows asked for out."""

    def __init__(self, model: Any, ops: LayerOps) -> None:
        """model: a LlamaForCausalLM or Qwen2ForCausalLM (read by attribute, as transformers lays it out)."""
        text = model.config.get_text_config()
        inner = model.model
        self.ops = ops
        self.embed = inner.embed_tokens.weight
        bf16 = self.embed.dtype == torch.bfloat16
        # The operations for the model's dtype (engine.cpu.plan chose this forward for float32 or bfloat16 alone).
        self._norm = ops.add_rms_norm_bf16 if bf16 else ops.add_rms_norm
        self._rope = ops.rope_bf16 if bf16 else ops.rope
        self._rope_and_store = ops.rope_and_store_bf16 if bf16 else ops.rope_and_store
        self._silu_mul = ops.silu_mul_bf16 if bf16 else ops.silu_mul
        self.rotary = inner.rotary_emb
        self.final_norm = inner.norm.weight
        self.eps = float(inner.norm.variance_epsilon)
        self.lm_head = _linear(model.lm_head)
        self.heads = text.num_attention_heads
        self.kv_heads = text.num_key_value_heads
        first = inner.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.scaling = float(first.scaling)
        self.layers = [
            _Layer(
                layer.input_layernorm.weight,
                _linear(layer.self_attn.q_proj),
                _linear(layer.self_attn.k_proj),
                _linear(layer.self_attn.v_proj),
                _linear(layer.self_attn.o_proj),
                layer.post_attention_layernorm.weight,
                _linear(layer.mlp.gate_proj),
                _linear(layer.mlp.up_proj),
                _linear(layer.mlp.down_proj),
            )
            for layer in inner.layers
        ]

    @torch.inference_mode()
    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions [T] -> logits [len(rows), vocab] of the rows asked for."""
        norm, tokens, hd = self._norm, input_ids.shape[0], self.head_dim
        h = F.embedding(input_ids, self.embed)
        cos, sin = (t[0].contiguous() for t in self.rotary(h, positions.unsqueeze(0)))
        residual, x = torch.empty_like(h), torch.empty_like(h)
        width = h.shape[1]
        for i, layer in enumerate(self.layers):
            norm(h.data_ptr(), residual.data_ptr(), layer.input_norm.data_ptr(), self.eps, tokens, width, int(i == 0),
                 x.data_ptr())  # fmt: skip
            q, k, v = layer.q(x), layer.k(x), layer.v(x)
            self._rotate_and_store(q, k, v, cos, sin, meta, i)
            out = attend(
                meta,
                i,
                q.view(tokens, self.heads, hd).transpose(0, 1),
                k.view(tokens, self.kv_heads, hd).transpose(0, 1),
                v.view(tokens, self.kv_heads, hd).transpose(0, 1),
                self.scaling,
            )
            h = layer.o(out.view(tokens, self.heads * hd))
            norm(h.data_ptr(), residual.data_ptr(), layer.post_norm.data_ptr(), self.eps, tokens, width, 0,
                 x.data_ptr())  # fmt: skip
            gate, up = layer.gate(x), layer.up(x)
            self._silu_mul(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), tokens, gate.shape[1])
            h = layer.down(gate)
        norm(h.data_ptr(), residual.data_ptr(), self.final_norm.data_ptr(), self.eps, tokens, width, 0,
             x.data_ptr())  # fmt: skip
        return self.lm_head(x.index_select(0, rows))

    def _rotate_and_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        meta: AttentionMetadata, layer: int,
    ) -> None:  # fmt: skip
        """Rotary embedding of q and k in place, and this step's keys and values into the pool: in C for a pool of
        the model's dtype or, in float32, an int8 pool (keys rotated and both quantized as engine.model.kv_cache
        does), else rotated in C and stored by torch."""
        meta = meta.for_layer(layer)
        ops, tokens, hd, slots = self.ops, q.shape[0], self.head_dim, meta.slot_mapping
        k_cache, v_cache = meta.key_cache[layer], meta.value_cache[layer]
        k_scale, v_scale = scales(meta, layer)
        rotated = (q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0))
        shape = (tokens, self.heads, self.kv_heads, hd)
        in_c_int8 = q.dtype == torch.float32 and k_cache.dtype == torch.int8 and hd <= MAX_ROTATED
        if k_cache.dtype == q.dtype:
            failed = self._rope_and_store(*rotated, v.data_ptr(), v.stride(0), cos.data_ptr(), sin.data_ptr(),
                                          slots.data_ptr(), *shape, k_cache.data_ptr(), v_cache.data_ptr(),
                                          k_cache.shape[1])  # fmt: skip
        elif in_c_int8 and k_scale is not None and v_scale is not None:
            failed = ops.rope_and_store_int8(*rotated, v.data_ptr(), v.stride(0), cos.data_ptr(), sin.data_ptr(),
                                             slots.data_ptr(), *shape, k_cache.data_ptr(), v_cache.data_ptr(),
                                             k_scale.data_ptr(), v_scale.data_ptr(), k_cache.shape[1])  # fmt: skip
        else:
            self._rope(*rotated, cos.data_ptr(), sin.data_ptr(), *shape)
            failed = int(bool(tokens) and not 0 <= int(slots.min()) <= int(slots.max()) < k_cache.shape[1])
            if not failed:
                store(k_cache, k_scale, slots, k.view(tokens, self.kv_heads, hd).transpose(0, 1), keys=True)
                store(v_cache, v_scale, slots, v.view(tokens, self.kv_heads, hd).transpose(0, 1))
        if failed:
            raise RuntimeError("a token's pool slot lies outside the KV pool (an engine bug)")


def cpu_forward(model: Any, plan: CpuPlan, features: ModelFeatures | None = None) -> tuple[CpuForward | None, CpuPlan]:
    """The engine's forward for this model where the plan chose it, else None (transformers'), and the plan with
    the outcome recorded. features: what engine.model.fidelity found; the engine's own forward computes only full
    causal attention with rope fixed at load."""
    if plan.forward.choice is not Forward.OWN:
        return None, plan
    why = _unsupported(model)
    if why is None and features is not None and not features.plain:
        why = (
            f"the engine's own computes full causal attention with fixed rope, and this model has {features.describe()}"
        )
    if why is not None:
        return None, plan.settled(forward=Decision(Forward.TRANSFORMERS, why))
    try:
        return CpuForward(model, build_layer_ops()), plan
    except KernelBuildError as exc:
        return None, plan.unbuilt("forward", exc)


def _unsupported(model: Any) -> str | None:
    """What of this model the engine's forward does not compute (the plan has checked its architecture)."""
    text = model.config.get_text_config()
    if getattr(text, "hidden_act", None) != "silu":
        return f"the engine's own computes SiLU, not {getattr(text, 'hidden_act', None)}"
    head_dim = model.model.layers[0].self_attn.head_dim
    if head_dim % 2:
        return f"rotary embedding needs an even head size, not {head_dim}"
    tensors = [p for p in model.parameters()] + [b for b in model.buffers()]
    if any(t.is_floating_point() and not t.is_contiguous() for t in tensors):
        return "a weight is not contiguous"
    return None


def _linear(module: Any) -> Linear:
    """The layer's own forward, without nn.Module's call machinery for the two kinds the engine makes."""
    if isinstance(module, PackedLinear) or type(module) is nn.Linear:
        return module.forward
    return module

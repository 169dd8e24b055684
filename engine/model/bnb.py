"""bitsandbytes quantization, in the one form both loads use: from_pretrained's config for a safetensors directory,
and layer-at-a-time quantization for a GGUF streamed tensor by tensor (engine.model.gguf_load).

The streamed GGUF takes transformers' own choices, so that it gives the bytes from_pretrained would: the layers
transformers' bitsandbytes quantizer leaves alone (output embeddings, tied weights, the last module) stay as they
are, every other nn.Linear becomes bitsandbytes' on the meta device before any weight is read, and each weight is
quantized the moment it is dequantized, from the compute dtype as from_pretrained casts it. So the device never
holds a 16-bit copy of the model, and the host never more than one tensor's: the load's peak is the quantized
weights plus one layer's transient.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import BitsAndBytesConfig
from transformers.quantizers.base import get_keys_to_not_convert

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def bnb_config(quantization: str, dtype: torch.dtype) -> BitsAndBytesConfig:
    """int8 (LLM.int8()), or nf4 / fp4 computing in `dtype` (no double quantization: its saving is 0.4 bit a
    weight, its cost a second dequantization every step)."""
    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quantization,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_use_double_quant=False,
    )


class LayerQuantizer:
    """Quantizes a meta-device model's linear layers one weight at a time, as their values arrive."""

    def __init__(self, quantization: str, dtype: torch.dtype, device: torch.device) -> None:
        self.config = bnb_config(quantization, dtype)
        self.dtype = dtype
        self.device = device

    def prepare(self, model: PreTrainedModel) -> None:
        """Swap in bitsandbytes' layers (still on the meta device) where transformers' quantizer would."""
        from transformers.integrations.bitsandbytes import replace_with_bnb_linear

        replace_with_bnb_linear(
            model, modules_to_not_convert=get_keys_to_not_convert(model), quantization_config=self.config
        )

    def takes(self, module: nn.Module, attr: str) -> bool:
        import bitsandbytes as bnb

        return attr == "weight" and isinstance(module, bnb.nn.Linear4bit | bnb.nn.Linear8bitLt)

    def quantize(self, module: nn.Module, chunks: Iterable[torch.Tensor]) -> None:
        """The layer's weight from its rows, a chunk at a time (float32, on the CPU), quantized on the device.

        bitsandbytes quantizes a whole tensor at once, and on a CPU its temporaries reach ~50 bytes a weight (an
        8B model's ffn weight: 2.8 GB). Both formats are blockwise along the rows (4-bit: 64 weights a block, no
        double quantization; int8: one scale a row), so chunks of whole blocks give the same bytes."""
        import bitsandbytes as bnb
        from bitsandbytes.functional import int8_vectorwise_quant, quantize_4bit

        old: Any = module.weight  # bitsandbytes Params4bit or Int8Params, on the meta device
        shape = old.shape
        if isinstance(module, bnb.nn.Linear4bit):
            assert not old.compress_statistics, "double quantization's absmax spans chunks"
            codes, absmax = [], []
            if shape[-1] * 16 % old.blocksize:  # chunks (16 rows each) would split a block: all rows at once
                chunks = [torch.cat(list(chunks))]
            for chunk in chunks:  # as from_pretrained: cast to the compute dtype, then quantized on the device
                packed, state = quantize_4bit(
                    chunk.to(self.dtype).to(self.device), blocksize=old.blocksize, quant_type=old.quant_type,
                    quant_storage=old.quant_storage,
                )  # fmt: skip
                codes.append(packed)
                absmax.append(state.absmax)
            state.absmax, state.shape = torch.cat(absmax), shape
            weight: Any = bnb.nn.Params4bit(
                torch.cat(codes), requires_grad=False, quant_state=state, blocksize=old.blocksize,
                compress_statistics=False, quant_type=old.quant_type, quant_storage=old.quant_storage,
                bnb_quantized=True, module=module,
            )  # fmt: skip
            module.weight = weight
            module.quant_state = state
            return
        rows, scales = [], []
        for chunk in chunks:  # LLM.int8() quantizes float16 rows (Int8Params._quantize)
            codes8, scale, _ = int8_vectorwise_quant(chunk.to(self.dtype).to(self.device, torch.float16))
            rows.append(codes8)
            scales.append(scale)
        data = torch.cat(rows)
        weight = bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False, CB=data, SCB=torch.cat(scales))
        module.weight = weight

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

    def quantize(self, module: nn.Module, values: torch.Tensor) -> None:
        """The layer's weight from `values` (its full-precision rows, on the CPU), quantized on the device."""
        import bitsandbytes as bnb

        old = module.weight
        values = values.to(self.dtype)  # from_pretrained casts to the compute dtype before it quantizes
        # Their .to(device) quantizes (bitsandbytes' typing of it confuses mypy).
        if isinstance(module, bnb.nn.Linear4bit):
            weight: Any = bnb.nn.Params4bit(values, requires_grad=False, **old.__dict__)
        else:
            kwargs = {key: value for key, value in old.__dict__.items() if key != "SCB"}
            weight = bnb.nn.Int8Params(values, requires_grad=False, **kwargs)
        module.weight = weight.to(self.device)

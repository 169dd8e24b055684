"""What an engine process that computes on a CPU leaves unimported: Triton, the GPU kernel compiler.

transformers' model code imports torch's compiler stack for its decorators, and that stack imports Triton
whenever it is installed (xgrammar depends on it, so it is): libtriton is mapped into every engine process, for
kernels a CPU never runs (70 MiB of a random:tiny engine's peak RSS here, and a little CPU). Triton marked absent,
torch's `has_triton_package()` is False, as on a machine without it; xgrammar masks CPU logits with its own code.
"""

from __future__ import annotations

import sys


def leave_gpu_compilers_out(device: str) -> None:
    """Before the model code's imports, in the engine's own process: make `import triton` fail unless `device`
    (EngineConfig.device: auto, cpu, cuda, cuda:N) may be a GPU."""
    if device == "auto":
        import torch  # its own import does not load Triton; transformers' model code does

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        sys.modules.setdefault("triton", None)  # type: ignore[arg-type]

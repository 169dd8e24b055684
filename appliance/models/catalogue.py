"""The local models: the models folder's Hugging Face directories and GGUF files, and the bundled default, each
with its size on disk, parameters and fit on this machine (`appliance models`, the console); `appliance models
add` copies or links one in.

The models folder is <data_dir>/models, which also holds the engine's own cache (GGUF conversions, random
presets' files): those entries are not listed, and a name that looks like one is refused."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from appliance.models.gguf_header import GGUFHeaderError, read_header
from appliance.models.size import DTYPE_BYTES, Machine, Shape, fit, machine, memory_need, model_shape
from appliance.settings import Settings
from engine.model.sources import RANDOM_PREFIX, default_model_path
from web.system.models import ModelEntry

# The loader's cache entries: hidden staging folders, random-<preset>[-seed<n>], <gguf stem>-<12 hex digits>.
CACHE_ENTRY = re.compile(r"^\.|^random-|-[0-9a-f]{12}$")
WEIGHT_SUFFIXES = (".safetensors", ".bin")


class NotAModel(ValueError):
    """What `models add` was given is not a model, or its name is taken: the message says which."""


class LocalModels:
    """The catalog the console switches from (web.system.models.Catalog); shapes are cached per file version."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._shapes: dict[tuple[str, int], Shape | str] = {}

    @property
    def folder(self) -> Path:
        return self.settings.model_cache_dir

    def models(self, served: str, served_kv_bytes: int | None) -> list[ModelEntry]:
        """`served_kv_bytes` (the server, its engine running): what the served model holds, its weights and this
        KV pool, counts as available for every model, itself included (it runs in that memory now)."""
        on = machine(self.settings)
        found = self._found()
        if not any(_same(spec, served) for _, spec, _ in found):
            found.insert(0, (served, served, "random preset" if served.startswith(RANDOM_PREFIX) else _kind(served)))
        shapes = {spec: self._shape(spec) for _, spec, _ in found}
        freed = 0
        served_shape = next((shapes[spec] for _, spec, _ in found if _same(spec, served)), None)
        if served_kv_bytes is not None and isinstance(served_shape, Shape):
            freed = self._held(served_shape, on) + served_kv_bytes
        entries = []
        for name, spec, kind in found:
            shape, served_here = shapes[spec], _same(spec, served)
            sized = shape if isinstance(shape, Shape) else None
            entries.append(
                ModelEntry(
                    name=name,
                    spec=spec,
                    kind=kind,
                    disk_bytes=_disk_bytes(spec),
                    params=sized.params if sized else None,
                    fit=fit(sized, self.settings, on, freed) if sized else None,
                    problem=None if sized else str(shape),
                    served=served_here,
                )
            )
        return entries

    def _found(self) -> list[tuple[str, str, str]]:
        """(name, spec, kind): the bundled model first, then the folder's entries by name."""
        found = []
        try:
            default_model_path()
            found.append(("default", "default", "bundled GGUF"))
        except Exception:  # engine.ModelLoadError: not installed; the folder may still hold models
            pass
        if self.folder.is_dir():
            for path in sorted(self.folder.iterdir()):
                if not CACHE_ENTRY.search(path.name) and (kind := _kind(str(path))):
                    found.append((path.name, str(path), kind))
        return found

    def _shape(self, spec: str) -> Shape | str:
        try:
            path = default_model_path() if spec == "default" else Path(spec)
            key = (spec, path.stat().st_mtime_ns if path.exists() else 0)
            if key not in self._shapes:
                self._shapes[key] = model_shape(spec)
            return self._shapes[key]
        except Exception as exc:  # ValueError, ModelLoadError, transformers' own: all mean "no estimate"
            return f"{exc}"

    def _held(self, shape: Shape, on: Machine) -> int:
        """Besides its KV pool, what the served model's engine gives back when it stops: weights and CUDA's share."""
        need = memory_need(shape, on.quantization, DTYPE_BYTES[on.dtype], self.settings.max_model_len, on.gpu)
        return need.weights + need.overhead


def add(settings: Settings, source: Path, link: bool) -> Path:
    """Copy (or symlink) a HF directory or a .gguf into the models folder under its own name; never overwrites.
    Raises NotAModel."""
    source = source.expanduser()
    if not source.exists():
        raise NotAModel(f"{source} does not exist")
    problem = _not_a_model(source)
    if problem:
        raise NotAModel(f"{source} is not a model: {problem}")
    folder = settings.model_cache_dir
    target = folder / source.name
    if CACHE_ENTRY.search(source.name):
        raise NotAModel(f"the name {source.name!r} looks like one of the engine's cache entries: rename it first")
    if target.exists() or target.is_symlink():
        raise NotAModel(f"{target} already exists: remove it or add the model under another name")
    folder.mkdir(parents=True, exist_ok=True)
    if link:
        target.symlink_to(source.resolve(), target_is_directory=source.is_dir())
        return target
    # A copy lands under a hidden name (a cache-entry name: never listed) and is renamed into place when whole.
    staging = Path(tempfile.mkdtemp(prefix=f".{source.name}.", dir=folder))
    try:
        copied = staging / source.name
        if source.is_dir():
            shutil.copytree(source, copied)
        else:
            shutil.copy2(source, copied)
        copied.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _not_a_model(path: Path) -> str | None:
    if path.is_dir():
        if not (path / "config.json").is_file():
            return "a directory without config.json (a Hugging Face model directory has one)"
        if not _has_weights(path):
            return "a directory with a config.json but no *.safetensors or *.bin weights"
        try:
            model_shape(str(path))
        except ValueError as exc:
            return str(exc)
        return None
    if path.suffix.lower() != ".gguf":
        return "neither a Hugging Face model directory nor a .gguf file"
    try:
        read_header(path)
    except (GGUFHeaderError, OSError) as exc:
        return str(exc)
    return None


def _kind(spec: str) -> str:
    path = Path(spec)
    if path.is_dir() and (path / "config.json").is_file() and _has_weights(path):
        return "HF directory"
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "GGUF"
    return ""


def _has_weights(path: Path) -> bool:
    return any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir())


def _same(spec: str, served: str) -> bool:
    if spec == served:
        return True
    if served == "default" or served.startswith(RANDOM_PREFIX) or spec == "default":
        return False
    return Path(spec).expanduser().resolve() == Path(served).expanduser().resolve()


def _disk_bytes(spec: str) -> int:
    if spec.startswith(RANDOM_PREFIX):
        return 0
    try:
        path = default_model_path() if spec == "default" else Path(spec)
    except Exception:  # engine.ModelLoadError: the bundled package is not installed
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0

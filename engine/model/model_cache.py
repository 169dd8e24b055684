"""The model cache's entries (converted GGUFs, a GGUF's config and packed weights, random presets): each appears
only by an atomic rename of a finished staging directory, so an entry that is present is complete, and a cut
build leaves nothing behind."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def is_complete(cache_entry: Path) -> bool:
    return (cache_entry / "config.json").is_file()


@contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """Build a cache entry in a sibling temp directory, then rename it into place: a cut build leaves none."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        staging.chmod(0o755)
        try:
            staging.rename(target)
        except OSError:
            if not is_complete(target):
                raise
            # Another process finished the same entry first; theirs is as good as ours.
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def gguf_cache_dir(gguf: Path, cache_root: Path) -> Path:
    """One cache entry per GGUF file version: a changed or moved file converts again."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return cache_root / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

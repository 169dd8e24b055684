"""Built kernels are kept between engine starts (engine.cpu.kernel_build): the second build of the same library is
a load from $XDG_CACHE_HOME/llm-appliance/kernels; another shape is another library; a directory others can write
to is never used; a cached file that is not a library is built again and replaced."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from engine.cpu import kernel_build
from engine.cpu.kernel_build import SOURCE, build_kernel, find_compiler

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C compiler")


def kept(cache: Path) -> list[str]:
    folder = cache / "llm-appliance" / "kernels"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_second_build_loads_the_kept_library_and_another_shape_builds_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _, first_s = build_kernel("float32", 24, 6, 2)
    assert [name.startswith("paged_decode-") and name.endswith(".so") for name in kept(tmp_path)] == [True]
    folder = tmp_path / "llm-appliance" / "kernels"
    assert folder.stat().st_mode & 0o777 == 0o700
    _, again_s = build_kernel("float32", 24, 6, 2)
    assert again_s < first_s and len(kept(tmp_path)) == 1
    build_kernel("float32", 24, 6, 3)  # two heads per KV head, not three: another library
    assert len(kept(tmp_path)) == 2 and not [n for n in kept(tmp_path) if n.endswith(".partial")]


def test_a_cache_others_can_write_to_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "llm-appliance" / "kernels"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    function, _ = build_kernel("float32", 40, 4, 4)
    assert function is not None and kept(tmp_path) == []


def test_a_kept_file_that_is_not_a_library_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiler = find_compiler()
    assert compiler is not None
    defines = ["-DHEAD_DIM=56", "-DGROUP=2"]
    name = f"paged_decode-{kernel_build._build_key(compiler, SOURCE, kernel_build.FLAGS, defines)}.so"
    folder = tmp_path / "llm-appliance" / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    (folder / name).write_bytes(b"not a shared object")
    function, _ = build_kernel("float32", 56, 4, 2)
    assert function is not None
    assert (folder / name).read_bytes()[:4] == b"\x7fELF"
    ctypes.CDLL(str(folder / name))  # what the next start loads is whole
    assert os.listdir(folder) == [name]

"""Builds the engine's C kernels with the host's C compiler and loads them with ctypes. No torch import:
`appliance doctor` asks whether they build before anything heavy is loaded.

engine/cpu/csrc/paged_decode.c is built for one model's shape (-DHEAD_DIM, -DGROUP), element type (-DELEM_BF16,
else float) and pool (-DKV_INT8 for an 8-bit one), so every inner loop has constant bounds and vectorises whole;
engine/cpu/csrc/packed_linear.c once per weight form (-DFORM_Q4, -DFORM_Q8, -DFORM_Q4F, -DFORM_Q8F, -DFORM_BF16) and
rounding (-DROUND_BF16 for a model served in bfloat16);
engine/cpu/csrc/layer_ops.c once. A build takes up to a second (more on a busy machine) and every engine start needs
two or three, so each library is kept in $XDG_CACHE_HOME/llm-appliance/kernels under a name that hashes all it was
built from: the sources, the flags, the compiler (path, size, time) and this CPU (-march=native). A directory that is
not the user's own, or not writable, is not used: the library is then built in a temporary directory, loaded and
the directory removed (a loaded library stays mapped).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError

CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "paged_decode.c"
LINEAR_SOURCE = CSRC / "packed_linear.c"
LINEAR_FORMS = ("q4", "q8", "q4f", "q8f", "bf16")
LAYER_SOURCE = CSRC / "layer_ops.c"
ELEMENTS = ("float32", "bfloat16")
MAX_HEAD_DIM, MAX_GROUP = 256, 32
COMPILE_TIMEOUT_S = 120
NO_COMPILER = "no C compiler (cc or gcc; install gcc, or set CC)"
# Reassociation lets the dot products and sums vectorise; finite math lets the clamp in exp do too (scores are
# finite: the kernel never adds -inf). No -ffast-math: linked into a shared object it may set flush-to-zero for
# the whole process.
FLAGS = (
    "-O3",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
    "-ffinite-math-only",
    "-fPIC",
    "-shared",
)
# The layer's elementwise operations follow transformers' rounding: no fused multiply-adds the source does not
# write (only its e^x does), no sums reassociated (a norm's sum of squares is added in torch's order), and
# infinities kept (SiLU of a large negative number divides by one).
LAYER_FLAGS = (
    "-O3",
    "-fno-math-errno",
    "-fno-signed-zeros",
    "-fno-trapping-math",
    "-ffp-contract=off",
    "-fPIC",
    "-shared",
)
# Tried in turn: the host's vector width and OpenMP (for more than one torch thread; it joins the libgomp torch
# loaded), then without what a compiler may not know (-march=native) or have (an OpenMP runtime).
VARIANTS = (("-march=native", "-fopenmp"), ("-march=native",), ())

_P, _I = ctypes.c_void_p, ctypes.c_int64
# paged_attention_rows' parameters, in order (see the source).
ARGTYPES: list[type[ctypes.c_void_p | ctypes.c_int64 | ctypes.c_float | ctypes.c_int]] = [
    *(_P, _I, _I),  # q, its token and head strides
    *(_P, _P, _P, _P, _I),  # k_cache, v_cache, their scales (an int8 pool's, else NULL), num_slots
    *(_P, _I),  # tables, max_blocks
    *(_P, _P, _P, _I),  # rows, table_of, lens, num_rows
    *(_I, _I, ctypes.c_float, _I),  # kv_heads, block_size, scale, max_len
    *(_I, ctypes.c_float, _P),  # the layer's window, softcap, sinks (engine.model.attention_features)
    *(_P, _I, ctypes.c_int),  # out, its token stride, threads
]
# packed_linear's parameters, in order (see its source).
LINEAR_ARGTYPES: list[type[ctypes.c_void_p | ctypes.c_int64 | ctypes.c_int]] = [
    *(_P, _I, _P, _P),  # x, its row stride, the packed weight, bias (or NULL)
    *(_P, _I, _I, _I, _I, ctypes.c_int),  # y, its row stride, rows, outputs, inputs, threads
]


# layer_ops' functions and their parameters, in order (see its source).
LAYER_ARGTYPES: dict[str, list[Any]] = {
    "add_rms_norm": [_P, _P, _P, ctypes.c_float, _I, _I, ctypes.c_int, _P],
    "rope": [_P, _I, _P, _I, _P, _P, _I, _I, _I, _I],
    "rope_and_store": [_P, _I, _P, _I, _P, _I, _P, _P, _P, _I, _I, _I, _I, _P, _P, _I],
    "rope_and_store_int8": [_P, _I, _P, _I, _P, _I, _P, _P, _P, _I, _I, _I, _I, _P, _P, _P, _P, _I],
    "silu_mul": [_P, _I, _P, _I, _I, _I],
}
# The same where the model computes in bfloat16 (their arrays bf16, the pool too).
LAYER_ARGTYPES |= {
    f"{name}_bf16": LAYER_ARGTYPES[name] for name in ("add_rms_norm", "rope", "rope_and_store", "silu_mul")
}


@dataclass(frozen=True, slots=True)
class LayerOps:
    """engine/cpu/csrc/layer_ops.c's entry points (engine.model.forward)."""

    add_rms_norm: Callable[..., None]
    rope: Callable[..., None]
    rope_and_store: Callable[..., int]
    rope_and_store_int8: Callable[..., int]
    silu_mul: Callable[..., None]
    add_rms_norm_bf16: Callable[..., None]
    rope_bf16: Callable[..., None]
    rope_and_store_bf16: Callable[..., int]
    silu_mul_bf16: Callable[..., None]
    build_s: float


class KernelBuildError(EngineError):
    """A kernel could not be built or loaded here; the message says why."""


def build_kernel(
    element: str, head_dim: int, heads: int, kv_heads: int, kv_int8: bool = False
) -> tuple[Callable[..., int], float]:
    """The kernel's entry point for this shape and element type (of the queries and output; of the pool too, unless
    kv_int8: an int8 pool with its scales), and the seconds its build took."""
    if element not in ELEMENTS:
        raise KernelBuildError(f"it computes {' or '.join(ELEMENTS)}, not {element}")
    group = heads // kv_heads if kv_heads > 0 else 0
    if group * kv_heads != heads or not 1 <= group <= MAX_GROUP or not 1 <= head_dim <= MAX_HEAD_DIM:
        raise KernelBuildError(f"{heads} heads over {kv_heads} KV heads of size {head_dim} are beyond it")
    shape = [f"-DHEAD_DIM={head_dim}", f"-DGROUP={group}"] + (["-DELEM_BF16"] if element == "bfloat16" else [])
    shape += ["-DKV_INT8"] if kv_int8 else []
    return _build(SOURCE, FLAGS, shape, "paged_attention_rows", ARGTYPES)


def build_packed_linear(form: str, round_bf16: bool = False) -> tuple[Callable[..., int], float]:
    """The packed linear layer's entry point for one weight form (engine.cpu.packed_linear), and its build's seconds.
    round_bf16: the entry point for bfloat16 activations, each weight rounded to bfloat16 as it is widened
    (engine.cpu.split_linear)."""
    if form not in LINEAR_FORMS:
        raise KernelBuildError(f"packed weights are {', '.join(LINEAR_FORMS)}, not {form}")
    if round_bf16:  # packed_linear_bf16: x and y bfloat16
        defines = [f"-DFORM_{form.upper()}", "-DROUND_BF16"]
        return _build(LINEAR_SOURCE, FLAGS, defines, "packed_linear_bf16", LINEAR_ARGTYPES)
    return _build(LINEAR_SOURCE, FLAGS, [f"-DFORM_{form.upper()}"], "packed_linear", LINEAR_ARGTYPES)


def build_layer_ops() -> LayerOps:
    start = time.monotonic()
    library = _library(LAYER_SOURCE, LAYER_FLAGS, [])
    functions = {}
    for name, argtypes in LAYER_ARGTYPES.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int if name.startswith("rope_and_store") else None
        functions[name] = function
    return LayerOps(**functions, build_s=time.monotonic() - start)


def _build(
    source: Path, flags: tuple[str, ...], defines: list[str], symbol: str, argtypes: list[Any]
) -> tuple[Callable[..., int], float]:
    start = time.monotonic()
    function = getattr(_library(source, flags, defines), symbol)
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function, time.monotonic() - start


def find_compiler() -> str | None:
    """The C compiler the kernels are built with: $CC, else cc or gcc on the PATH; None where there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _library(source: Path, flags: tuple[str, ...], defines: list[str]) -> ctypes.CDLL:
    compiler = find_compiler()
    if compiler is None:
        raise KernelBuildError(NO_COMPILER)
    kept = _cache_dir()
    name = f"{source.stem}-{_build_key(compiler, source, flags, defines)}.so"
    if kept is not None and (kept / name).is_file():
        with contextlib.suppress(OSError):  # unreadable or not a library after all: built again below
            return ctypes.CDLL(str(kept / name))
    with tempfile.TemporaryDirectory(prefix="appliance-kernel-") as tmp:
        library = Path(tmp) / name
        error = ""
        for extra in VARIANTS:
            error = _compile([compiler, *flags, *extra, *defines, str(source), "-o", str(library)])
            if not error:
                break
        else:
            raise KernelBuildError(f"{Path(compiler).name} failed: {error}")
        try:
            loaded = ctypes.CDLL(str(library))
        except OSError as exc:  # e.g. a temporary directory mounted noexec
            raise KernelBuildError(f"the built library does not load: {exc}") from exc
        if kept is not None:
            _keep(library, kept / name)
        return loaded


def _cache_dir() -> Path | None:
    """Where built libraries are kept: the user's own directory, writable by no one else; None where it cannot be."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "llm-appliance" / "kernels"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError:
        return None
    # A library loaded from here runs in the engine: nobody else may have put it there.
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
        return None
    return path


def _build_key(compiler: str, source: Path, flags: tuple[str, ...], defines: list[str]) -> str:
    """A hash of everything the library depends on: every source file (they include each other), the flags and
    variants, the compiler binary, and this CPU's model and flags (the build targets -march=native)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in source.parent.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(repr((flags, VARIANTS, defines, source.name)).encode())
    resolved = shutil.which(compiler) or compiler
    with contextlib.suppress(OSError):
        info = Path(resolved).resolve().stat()
        digest.update(f"{Path(resolved).resolve()}:{info.st_size}:{info.st_mtime_ns}".encode())
    digest.update(_cpu_identity().encode())
    return digest.hexdigest()[:32]


def _cpu_identity() -> str:
    """The first CPU's model name and flags (what -march=native reads); '' where /proc/cpuinfo is missing."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    wanted = [line for line in lines if line.partition(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(wanted[:2])


def _keep(library: Path, target: Path) -> None:
    """Put a built library in the cache whole (a copy renamed into place), or not at all."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(library, partial)
        os.replace(partial, target)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()


def _compile(command: list[str]) -> str:
    """'' on success, else the compiler's last words."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return ""
    lines = (done.stderr or done.stdout or f"exit status {done.returncode}").strip().splitlines()
    return " | ".join(lines[-3:])

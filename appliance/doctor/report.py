"""`appliance doctor`: checks what the appliance needs on this machine and explains each finding in one line:
GPU and driver, CUDA in torch, memory against the model's needs, bitsandbytes, the compute dtype, the engine's CPU
plan (threads, attention, linear layers, forward), the model, the data directory, the database schema, the port and
the disk. Any failure makes the exit status non-zero."""

from __future__ import annotations

import glob
import importlib.metadata
import logging
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

from appliance.doctor.backends import backends_finding
from appliance.doctor.cpu import CpuFindings
from appliance.doctor.host import FAIL, INFO, OK, WARN, Finding, HostChecks
from appliance.doctor.probes import Gpu, cpu_flag, nvidia_gpus
from appliance.doctor.vllm import vllm_finding
from appliance.models.size import MemoryNeed, Shape, memory_need, model_shape
from appliance.settings import Settings
from engine.cpu.hardware import auto_cpu_dtype, auto_quantization, cpu_flags, describe, has_native_bf16
from web.console.render import fmt_bytes

# Where one of these exists a GPU may be usable, and only then is torch imported (seconds) to ask it: NVIDIA's
# nodes, WSL2's GPU paravirtualization, AMD's ROCm (which torch also drives as "cuda").
GPU_NODES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")


class Doctor(HostChecks):
    """Each check is a method returning one Finding; later checks reuse what earlier ones found. The machine's
    own checks (data dir, database, port, disk, assets) are HostChecks'."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.wants_gpu = settings.device.startswith("cuda")
        self.allows_gpu = settings.device != "cpu"

    def findings(self) -> Iterator[Finding]:
        checks: list[Callable[[], Finding]] = [
            self.check_gpu,
            self.check_cuda,
            self.check_memory,
            self.check_bitsandbytes,
            self.check_compute,
            self.check_cpu_plan,
            self.check_decode_attention,
            self.check_linear_layers,
            self.check_model,
            self.check_data_dir,
            self.check_database,
            self.check_port,
            self.check_disk,
            self.check_assets,
            self.check_backends,
        ]
        if self.settings.engine == "vllm":
            checks.insert(checks.index(self.check_model) + 1, self.check_vllm)
        for check in checks:
            try:
                yield check()
            except Exception as exc:  # a check that breaks must not hide the others
                name = check.__name__.removeprefix("check_").replace("_", " ")
                yield Finding(FAIL, name, f"the check itself failed: {type(exc).__name__}: {exc}")

    def check_vllm(self) -> Finding:
        return vllm_finding(self.settings)

    def check_backends(self) -> Finding:
        return backends_finding(self.settings)

    # -- GPU --------------------------------------------------------------------------------------------

    @cached_property
    def gpus(self) -> list[Gpu] | str:
        return nvidia_gpus()

    def check_gpu(self) -> Finding:
        nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
        gpus = self.gpus
        listed = "; ".join(f"{g.name} ({g.total_mib / 1024:.0f} GiB)" for g in gpus) if isinstance(gpus, list) else ""
        if not self.allows_gpu:
            return Finding(INFO, "gpu", f"skipped: APPLIANCE_DEVICE=cpu{'; present: ' + listed if listed else ''}")
        if isinstance(gpus, list) and gpus:
            return Finding(OK, "gpu", f"{listed}, NVIDIA driver {gpus[0].driver}")
        if gpus == "no nvidia-smi" and not nodes:
            then = "but APPLIANCE_DEVICE asks for one" if self.wants_gpu else "the engine will run on the CPU"
            return Finding(
                FAIL if self.wants_gpu else INFO,
                "gpu",
                f"no NVIDIA GPU or driver visible (no nvidia-smi, no /dev/nvidia*): {then}",
            )
        if gpus == "no nvidia-smi":
            return Finding(
                WARN,
                "gpu",
                f"{', '.join(nodes)} present but no nvidia-smi to describe them (it comes with the driver's utilities)",
            )
        why = gpus if isinstance(gpus, str) else "nvidia-smi lists no GPU"
        return Finding(
            FAIL if self.wants_gpu or nodes else WARN,
            "gpu",
            f"{why}; device nodes: {', '.join(nodes) or 'none'} (is the driver loaded? after a driver upgrade, reboot)",
        )

    @cached_property
    def torch(self) -> Any:
        import torch

        return torch

    @cached_property
    def gpu_may_exist(self) -> bool:
        listed = isinstance(self.gpus, list) and bool(self.gpus)
        return listed or self.wants_gpu or any(glob.glob(pattern) for pattern in GPU_NODES)

    @cached_property
    def cuda(self) -> bool:
        """Whether the engine will run on CUDA (as engine.model.loader.resolve_device decides)."""
        return self.allows_gpu and self.gpu_may_exist and bool(self.torch.cuda.is_available())

    @cached_property
    def quantization(self) -> str:
        """The setting, with `auto` resolved as the engine resolves it (engine.cpu.hardware)."""
        chosen = self.settings.quantization
        return auto_quantization("cuda" if self.cuda else "cpu", cpu_flags()) if chosen == "auto" else chosen

    @property
    def quantization_label(self) -> str:
        return f"{self.quantization}, chosen by auto" if self.settings.quantization == "auto" else self.quantization

    @property
    def cuda_index(self) -> int:
        return 0 if self.settings.device == "auto" else self.torch.device(self.settings.device).index or 0

    def check_cuda(self) -> Finding:
        if not self.allows_gpu or not self.gpu_may_exist:
            # Nothing a GPU could be reached through: torch's version from its metadata, without importing it.
            version = importlib.metadata.version("torch")
            if not self.allows_gpu:
                return Finding(INFO, "cuda", f"skipped: APPLIANCE_DEVICE=cpu (torch {version})")
            build = " (a CPU-only build)" if version.endswith("+cpu") else ""
            return Finding(INFO, "cuda", f"skipped: no GPU; torch {version}{build} will run on the CPU")
        torch = self.torch
        version = torch.__version__
        if self.cuda:
            index = self.cuda_index
            if index >= torch.cuda.device_count():
                return Finding(
                    FAIL,
                    "cuda",
                    f"{self.settings.device} does not exist: torch sees {torch.cuda.device_count()} CUDA device(s)",
                )
            try:
                torch.ones(4, device=f"cuda:{index}").add_(1).sum().item()
            except RuntimeError as exc:
                return Finding(FAIL, "cuda", f"torch {version} sees the GPU but cannot run on it: {exc}")
            major, minor = torch.cuda.get_device_capability(index)
            return Finding(
                OK,
                "cuda",
                f"torch {version} (CUDA {torch.version.cuda}) runs on cuda:{index}, "
                f"{torch.cuda.get_device_name(index)}, compute capability {major}.{minor}",
            )
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        if (isinstance(self.gpus, list) and self.gpus) or self.wants_gpu:
            fix = (
                "install the CUDA build of torch"
                if torch.version.cuda is None
                else "its CUDA runtime may need a newer driver than this one"
            )
            return Finding(FAIL, "cuda", f"torch {version} ({build}) cannot use the GPU: {fix}")
        return Finding(INFO, "cuda", f"skipped: no GPU; torch {version} ({build}) will run on the CPU")

    # -- memory and quantization --------------------------------------------------------------------------

    @cached_property
    def shape(self) -> Shape | str:
        try:
            return model_shape(self.settings.model)
        except Exception as exc:  # ValueError, ModelLoadError, json and gguf errors: all mean "no estimate"
            return f"{exc}"

    def need(self, shape: Shape) -> MemoryNeed:
        dtype = self.settings.dtype
        if dtype == "auto":
            dtype = "bfloat16" if self.cuda else auto_cpu_dtype(cpu_flags())
        dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
        settings = self.settings
        return memory_need(
            shape, self.quantization, dtype_bytes, settings.max_model_len, self.cuda, settings.kv_cache_dtype
        )

    def check_memory(self) -> Finding:
        shape = self.shape
        if isinstance(shape, str):
            return Finding(INFO, "memory", f"skipped: cannot estimate the model's size ({shape})")
        need = self.need(shape)
        what = f"weights {fmt_bytes(need.weights)} ({shape.params / 1e9:.2f} B parameters, {self.quantization_label})"
        if not self.cuda:
            import psutil

            available = psutil.virtual_memory().available
            total = need.weights + self.settings.kv_cache_bytes
            summary = (
                f"RAM: needs ≈ {fmt_bytes(total)}: {what} + KV pool {fmt_bytes(self.settings.kv_cache_bytes)} "
                f"(APPLIANCE_KV_CACHE_BYTES); {fmt_bytes(available)} available"
            )
            if available < total and not self.appliance_running:
                return Finding(WARN, "memory", summary + ": it would swap; lower APPLIANCE_KV_CACHE_BYTES")
            return Finding(OK, "memory", summary)
        index = self.cuda_index
        free, total = self.torch.cuda.mem_get_info(index)
        sequence = need.kv_per_token * need.context
        summary = (
            f"VRAM: needs ≈ {fmt_bytes(need.minimum)}: {what} + KV {fmt_bytes(sequence)} for one "
            f"{need.context:,}-token sequence + ~{fmt_bytes(need.overhead)} CUDA; "
            f"{fmt_bytes(free)} free of {fmt_bytes(total)}"
        )
        if free >= need.minimum:
            seats = (free * self.settings.gpu_memory_utilization - need.weights - need.overhead) // sequence
            return Finding(OK, "memory", f"{summary}: KV for ≈ {max(int(seats), 1):,} full-length sequences")
        if self.appliance_running:
            return Finding(INFO, "memory", f"{summary}, the running appliance holds its share now")
        return Finding(
            FAIL,
            "memory",
            f"{summary}: use nf4, a shorter APPLIANCE_MAX_MODEL_LEN or a smaller model, "
            "or stop what else uses the GPU (nvidia-smi lists it)",
        )

    def check_bitsandbytes(self) -> Finding:
        quantization = self.quantization
        if quantization == "none":
            return Finding(INFO, "bitsandbytes", f"skipped: quantization {self.quantization_label} does not use it")
        # Its CPU backend logs a warning at import when an optional hub kernel is missing; doctor says more.
        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
        try:
            import bitsandbytes as bnb
            from bitsandbytes.functional import has_avx512bf16
        except Exception as exc:  # a broken native library raises anything
            return Finding(FAIL, "bitsandbytes", f"cannot import bitsandbytes: {type(exc).__name__}: {exc}")
        torch = self.torch
        device = "cuda" if self.cuda else "cpu"
        dtype = torch.float16 if self.cuda else torch.float32
        try:
            layer: Any = (
                bnb.nn.Linear8bitLt(64, 64, bias=False, has_fp16_weights=False)
                if quantization == "int8"
                else bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=dtype, quant_type=quantization)
            )
            layer.to(dtype).to(device)(torch.randn(2, 64, dtype=dtype, device=device))
        except Exception as exc:  # bitsandbytes raises RuntimeError, ValueError, NotImplementedError...
            return Finding(
                FAIL,
                "bitsandbytes",
                f"bitsandbytes {bnb.__version__} cannot run {quantization} on {device}: {type(exc).__name__}: {exc}",
            )
        done = f"bitsandbytes {bnb.__version__} runs {quantization} on {device}"
        if self.cuda or quantization == "int8":
            return Finding(OK, "bitsandbytes", done)
        if cpu_flag("avx512_bf16") and has_avx512bf16():
            return Finding(OK, "bitsandbytes", f"{done}; the CPU has AVX512-BF16: the fast 4-bit path")
        return Finding(
            WARN,
            "bitsandbytes",
            f"{done}, but without AVX512-BF16 4-bit matmuls take the slow path; "
            "APPLIANCE_QUANTIZATION=none may be faster on this CPU",
        )

    # -- files --------------------------------------------------------------------------------------------

    @property
    def compute_dtype(self) -> str:
        dtype = self.settings.dtype
        return ("bfloat16" if self.cuda else auto_cpu_dtype(cpu_flags())) if dtype == "auto" else dtype

    def check_compute(self) -> Finding:
        """What the engine will compute in, with the CPU flags that `auto` read to choose it (engine.cpu.hardware)."""
        dtype, chosen = self.settings.dtype, self.compute_dtype
        where = "CUDA" if self.cuda else f"CPU flags: {describe(cpu_flags())}"
        by_auto = ", chosen by auto" if dtype == "auto" else ""
        summary = f"quantization {self.quantization_label}; compute dtype {chosen}{by_auto} ({where})"
        if not self.cuda and chosen == "bfloat16" and not has_native_bf16(cpu_flags()):
            return Finding(WARN, "compute", f"{summary}: this CPU emulates bf16, float32 is faster (APPLIANCE_DTYPE)")
        return Finding(OK, "compute", summary)

    @cached_property
    def cpu(self) -> CpuFindings:
        return CpuFindings(self.settings, self.cuda, self.compute_dtype)

    def check_cpu_plan(self) -> Finding:
        """The engine's CPU plan (engine.cpu.plan): torch's threads and the allocator."""
        return self.cpu.plan_finding()

    def check_decode_attention(self) -> Finding:
        """The plan's attention, its compiled kernel built here once (a C compiler, and a temporary directory the
        built library loads from); the engine builds its own at start for the model's whole shape."""
        return self.cpu.attention_finding()

    def check_linear_layers(self) -> Finding:
        """The plan's linear layers and forward, their kernels built here once."""
        return self.cpu.linear_finding()

    def check_model(self) -> Finding:
        model = self.settings.model
        if model.startswith("random:"):
            if isinstance(self.shape, str):
                return Finding(FAIL, "model", self.shape)
            return Finding(OK, "model", f"{model}: random weights for tests, nothing to find")
        if model == "default":
            from engine.model.sources import default_model_path

            try:
                path = default_model_path()
            except Exception as exc:  # engine.ModelLoadError says how to install it
                return Finding(FAIL, "model", f"default: {exc}")
            return Finding(
                OK,
                "model",
                f"default: the bundled {path.name} ({fmt_bytes(path.stat().st_size)}), "
                "converted once at the first start",
            )
        path = Path(model).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            weights = sum(p.stat().st_size for p in path.glob("*.safetensors"))
            if not weights:
                return Finding(FAIL, "model", f"{path} has a config.json but no *.safetensors weights")
            return Finding(OK, "model", f"Hugging Face directory {path} ({fmt_bytes(weights)} of safetensors)")
        if path.is_file() and path.suffix.lower() == ".gguf":
            return Finding(OK, "model", f"GGUF file {path} ({fmt_bytes(path.stat().st_size)}), converted once")
        what = "does not exist" if not path.exists() else "is neither a model directory (config.json) nor a .gguf"
        return Finding(FAIL, "model", f"APPLIANCE_MODEL={model}: {path} {what}")


def run(settings: Settings) -> int:
    failures = warnings = 0
    for finding in Doctor(settings).findings():
        print(finding.line(), flush=True)
        failures += finding.level == FAIL
        warnings += finding.level == WARN
    print(f"doctor: {failures} failure(s), {warnings} warning(s)")
    return 1 if failures else 0

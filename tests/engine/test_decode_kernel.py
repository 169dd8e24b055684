"""The compiled attention (engine.cpu.decode_kernel) equals SDPA over each row's own context, for decodes and for
prefill chunks continuing a context, for the shapes and dtypes it builds for, whatever the block tables,
lengths and thread count; where it cannot be built the engine says why and keeps torch's, unless told to
insist."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.cpu.decode_kernel import AttentionKernel, AttentionRows, KernelBuildError, RowsBuilder, attention_kernel
from engine.cpu.plan import Attention, CpuPlan, cpu_plan, this_machine
from engine.errors import ConfigError

CPU = torch.device("cpu")


def attempt(
    mode: str, device: torch.device, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int
) -> tuple[AttentionKernel | None, CpuPlan]:
    """The kernel as the engine gets it: the CPU plan for this mode, device and dtype, then its build."""
    config = EngineConfig(decode_attention=mode)  # type: ignore[arg-type]
    plan = cpu_plan(config, device.type, str(dtype).removeprefix("torch."), "LlamaForCausalLM", this_machine())
    return attention_kernel(plan, dtype, head_dim, heads, kv_heads)


def compiled(dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> AttentionKernel:
    kernel, _ = attempt("compiled", CPU, dtype, head_dim, heads, kv_heads)
    assert kernel is not None
    return kernel


def paged_case(
    dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, lens: list[int], block_size: int = 16, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]]]:
    """A pool of random keys and values, each request's blocks scattered through it, and one query per request."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [(n + block_size - 1) // block_size for n in lens]
    pool = sum(blocks) + 7  # some blocks nobody owns
    k_cache = torch.randn(kv_heads, pool * block_size, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, pool * block_size, head_dim, generator=gen).to(dtype)
    order = list(range(pool))
    random.Random(seed).shuffle(order)
    tables, used = [], 0
    for count in blocks:
        tables.append(order[used : used + count])
        used += count
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables


def reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: list[list[int]], lens: list[int], bs: int
) -> torch.Tensor:
    """SDPA in float64 over each request's slots, read one by one."""
    out = []
    for b, (table, n) in enumerate(zip(tables, lens, strict=True)):
        slots = torch.tensor([table[t // bs] * bs + t % bs for t in range(n)])
        k = k_cache[:, slots].double().unsqueeze(0)
        v = v_cache[:, slots].double().unsqueeze(0)
        qb = q[b].double().unsqueeze(0).unsqueeze(2)  # [1, H, 1, D]
        out.append(F.scaled_dot_product_attention(qb, k, v, enable_gqa=True)[0, :, 0])
    return torch.stack(out)


def decode_rows(tables: list[list[int]], lens: list[int], block_size: int = 16) -> AttentionRows:
    """Request b decodes as row b over its lens[b] tokens."""
    builder = RowsBuilder(block_size)
    for b, (table, n) in enumerate(zip(tables, lens, strict=True)):
        builder.add(table, b, 1, n)
    rows = builder.build()
    assert rows is not None
    return rows


# (heads, kv heads, head dim): SmolLM2-135M's first; then more query heads a KV head (6) than the others, and a
# head of 24 (three 8-float vectors, not whole 16-float ones)
SHAPES = [(9, 3, 64), (4, 4, 32), (8, 2, 16), (2, 1, 128), (12, 2, 80), (4, 1, 24)]
LENS = [1, 2, 15, 16, 17, 31, 33, 300, 64, 5]  # around the block edges, one long


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{h}h-{k}kv-d{d}" for h, k, d in SHAPES])
def test_equals_sdpa_over_each_requests_own_blocks(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    heads, kv_heads, head_dim = shape
    kernel = compiled(dtype, head_dim, heads, kv_heads)
    assert kernel is not None
    q, k_cache, v_cache, tables = paged_case(dtype, heads, kv_heads, head_dim, LENS)
    out = torch.full_like(q, float("nan"))
    kernel(q, k_cache, v_cache, decode_rows(tables, LENS), head_dim**-0.5, out)
    want = reference(q, k_cache, v_cache, tables, LENS, 16)
    # bf16: the output is rounded once (2^-8 relative); float32 sums in another order than float64.
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 2e-6, "rtol": 2e-5}
    torch.testing.assert_close(out.double(), want, **tol)


def test_reads_the_query_through_its_strides_and_writes_only_its_rows() -> None:
    """The attention layer hands it the step's q as [H, T, D].transpose(0, 1) and the whole step's output, of
    which the other rows (fresh prefills, SDPA's) are not its own."""
    heads, kv_heads, head_dim, lens = 9, 3, 64, [40, 3, 17]
    kernel = compiled(torch.float32, head_dim, heads, kv_heads)
    assert kernel is not None
    q, k_cache, v_cache, tables = paged_case(torch.float32, heads, kv_heads, head_dim, lens, seed=1)
    step_q = torch.cat([q, torch.randn(5, heads, head_dim)]).transpose(0, 1).contiguous()  # [H, T, D]: 5 prefills
    out = torch.zeros(len(lens) + 5, heads, head_dim)
    kernel(step_q.transpose(0, 1), k_cache, v_cache, decode_rows(tables, lens), 0.125, out)
    want = reference(q, k_cache, v_cache, tables, lens, 16)
    torch.testing.assert_close(out[:3].double(), want, atol=2e-6, rtol=2e-5)
    assert not out[3:].any(), "rows beyond the decodes were written"


def test_prefill_rows_continuing_a_context_attend_causally_over_it() -> None:
    """Two prefills' chunks after 20 and 35 computed tokens, beside a decode: row i of a chunk sees its context and
    the chunk's tokens up to itself, as SDPA with the causal mask over the whole sequence gives."""
    heads, kv_heads, head_dim, bs = 9, 3, 64, 16
    computed, chunk = [20, 35], [12, 30]
    totals = [c + n for c, n in zip(computed, chunk, strict=True)] + [50]
    for dtype in (torch.float32, torch.bfloat16):
        kernel = compiled(dtype, head_dim, heads, kv_heads)
        assert kernel is not None
        _, k_cache, v_cache, tables = paged_case(dtype, heads, kv_heads, head_dim, totals, seed=3)
        q = torch.randn(1 + sum(chunk), heads, head_dim).to(dtype)  # the decode's row, then the chunks'
        builder = RowsBuilder(bs)
        builder.add(tables[2], 0, 1, 50)
        builder.add(tables[0], 1, chunk[0], computed[0] + 1)
        builder.add(tables[1], 1 + chunk[0], chunk[1], computed[1] + 1)
        rows = builder.build()
        assert rows is not None and rows.rows.tolist() == list(range(1 + sum(chunk)))
        out = torch.empty_like(q)
        kernel(q, k_cache, v_cache, rows, head_dim**-0.5, out)
        want = [reference(q[:1], k_cache, v_cache, [tables[2]], [50], bs)]
        start = 1
        for t, (c, n) in enumerate(zip(computed, chunk, strict=True)):
            for i in range(n):  # token c + i sees c + i + 1 tokens
                want.append(reference(q[start + i : start + i + 1], k_cache, v_cache, [tables[t]], [c + i + 1], bs))
            start += n
        tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 2e-6, "rtol": 2e-5}
        torch.testing.assert_close(out.double(), torch.cat(want), **tol)


@pytest.mark.parametrize("bad", ["block-beyond-pool", "negative-block"])
def test_a_row_outside_its_table_or_the_pool_is_an_error_not_a_crash(bad: str) -> None:
    heads, kv_heads, head_dim = 9, 3, 64
    kernel = compiled(torch.float32, head_dim, heads, kv_heads)
    assert kernel is not None
    q, k_cache, v_cache, tables = paged_case(torch.float32, heads, kv_heads, head_dim, [40, 20])
    pool_blocks = k_cache.shape[1] // 16
    builder = RowsBuilder(16)
    builder.add(tables[0], 0, 1, 40)
    if bad == "block-beyond-pool":
        builder.add([*tables[1][:-1], pool_blocks], 1, 1, 20)
    else:
        builder.add([-1, *tables[1][1:]], 1, 1, 20)
    rows = builder.build()
    assert rows is not None
    with pytest.raises(RuntimeError, match="outside the KV pool"):
        kernel(q, k_cache, v_cache, rows, 0.125, torch.empty_like(q))


def test_a_row_longer_than_its_block_table_is_refused() -> None:
    builder = RowsBuilder(16)
    builder.add([3, 4], 0, 1, 32)
    with pytest.raises(ValueError, match="short of 33 tokens"):
        builder.add([3, 4], 1, 1, 33)
    with pytest.raises(ValueError, match="short of 34 tokens"):
        builder.add([5, 6], 2, 4, 31)  # a chunk whose last row is token 34


def test_no_rows_build_nothing() -> None:
    assert RowsBuilder(16).build() is None


def test_several_threads_give_what_one_gives() -> None:
    heads, kv_heads, head_dim = 9, 3, 64
    lens = [random.Random(5).randrange(1, 400) for _ in range(24)]
    kernel = compiled(torch.bfloat16, head_dim, heads, kv_heads)
    assert kernel is not None
    q, k_cache, v_cache, tables = paged_case(torch.bfloat16, heads, kv_heads, head_dim, lens, seed=2)
    batch = decode_rows(tables, lens)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out = torch.empty_like(q)
            kernel(q, k_cache, v_cache, batch, head_dim**-0.5, out)
            outs.append(out)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])


def test_torch_mode_builds_nothing() -> None:
    kernel, plan = attempt("torch", CPU, torch.float32, 64, 9, 3)
    assert (
        kernel is None
        and plan.attention.choice is Attention.TORCH
        and "APPLIANCE_DECODE_ATTENTION" in plan.attention.reason
    )


@pytest.mark.parametrize(
    ("device", "dtype", "shape", "auto_says", "why"),
    [
        (torch.device("cuda"), torch.float32, (9, 3, 64), "not a CPU", "for CPUs"),
        (CPU, torch.float16, (9, 3, 64), "not float16", "not float16"),
        (CPU, torch.float32, (9, 2, 64), "beyond it", "beyond it"),  # heads not a multiple of KV heads
        (CPU, torch.float32, (4, 4, 512), "beyond it", "beyond it"),
    ],
    ids=["cuda", "float16", "uneven-groups", "head-too-large"],
)
def test_what_it_cannot_compute_falls_back_or_is_refused(
    device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int], auto_says: str, why: str
) -> None:
    heads, kv_heads, head_dim = shape
    kernel, plan = attempt("auto", device, dtype, head_dim, heads, kv_heads)
    assert kernel is None and plan.attention.choice is Attention.TORCH and str(plan.attention.choice) == "torch's"
    assert auto_says in plan.attention.reason
    with pytest.raises(KernelBuildError, match=why):
        attempt("compiled", device, dtype, head_dim, heads, kv_heads)


def test_no_compiler_falls_back_in_auto_and_stops_the_engine_in_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    kernel, plan = attempt("auto", CPU, torch.float32, 64, 9, 3)
    assert kernel is None and plan.attention.choice is Attention.TORCH and plan.attention.fallback
    assert "cc failed" in plan.attention.reason
    config = EngineConfig(
        model="random:tiny", quantization="none", dtype="float32", device="cpu", decode_attention="compiled"
    )
    with pytest.raises(KernelBuildError, match="cc failed"):
        EngineCore(config)


def test_a_compiler_that_fails_is_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "false")
    with pytest.raises(KernelBuildError, match="false failed: exit status 1"):
        attempt("compiled", CPU, torch.float32, 64, 9, 3)


def test_an_unknown_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="decode_attention must be one of auto, compiled, torch"):
        EngineConfig(decode_attention="flash")  # type: ignore[arg-type]

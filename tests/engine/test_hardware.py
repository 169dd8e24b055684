"""The CPU flags behind the auto quantization and dtype are read from /proc/cpuinfo's text."""

from __future__ import annotations

from engine.cpu.hardware import describe, parse_flags

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 avx512_vnni
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse2
"""


def test_flags_come_from_the_first_cpu_and_only_the_flags_line() -> None:
    flags = parse_flags(CPUINFO.splitlines())
    assert {"avx2", "avx512f", "avx512_bf16"} <= flags
    assert "sysret_ss_attrs" not in flags and "AuthenticAMD" not in flags
    assert describe(flags) == "avx2, avx512f, avx512_bf16"


def test_no_flags_line_means_no_flags() -> None:
    assert parse_flags(["processor : 0", "Features : fp asimd"]) == frozenset()
    assert describe(frozenset()) == "none of avx2, avx512f, avx512_bf16, amx_bf16"

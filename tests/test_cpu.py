"""What multihead.cpu reads of the processor: the first processor's fields of a /proc/cpuinfo, nothing where there is
none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from multihead import cpu

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9B45
flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
flags\t\t: fpu
"""


@pytest.fixture
def cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "cpuinfo"
    monkeypatch.setattr(cpu, "CPUINFO", path)
    cpu._first_cpu.cache_clear()
    yield path
    cpu._first_cpu.cache_clear()


def test_the_first_processors_fields_are_read(cpuinfo: Path) -> None:
    cpuinfo.write_text(CPUINFO)
    assert cpu.vendor() == "AuthenticAMD"
    assert cpu.family() == 26
    assert cpu.flags() == {"fpu", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
    assert cpu.has_vnni()


def test_without_a_cpuinfo_nothing_is_known(cpuinfo: Path) -> None:
    assert (cpu.vendor(), cpu.family(), cpu.flags(), cpu.has_vnni()) == ("", None, frozenset(), False)


def test_a_processor_without_vnni(cpuinfo: Path) -> None:
    cpuinfo.write_text("vendor_id : GenuineIntel\ncpu family : 6\nflags : fpu avx2 avx512f\n")
    assert (cpu.vendor(), cpu.family(), cpu.has_vnni()) == ("GenuineIntel", 6, False)


def test_a_benchmark_names_the_cpu_its_kind_and_its_vector_units(
    cpuinfo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpuinfo.write_text(CPUINFO)
    monkeypatch.setattr(cpu, "usable_cores", lambda: 3)
    expected = "AMD EPYC 9B45 (AuthenticAMD family 26 model 2; avx2 avx512f avx512_bf16 avx512_vnni; 3 cores)"
    assert cpu.describe() == expected
    cpuinfo.write_text("")
    cpu._first_cpu.cache_clear()
    assert cpu.describe() == (
        "unknown CPU (unknown vendor family None model ?; none of avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 "
        "amx_int8; 3 cores)"
    )

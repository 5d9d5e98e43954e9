"""The memory guard's figures, parsed from recorded outputs of both systems (/proc/meminfo from
a Linux machine; macOS's ``vm_stat`` and ``sysctl -n hw.memsize``), and its refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from macbatch.models.memory import (
    GIB,
    MIB,
    Memory,
    Need,
    need_of,
    parse_meminfo,
    parse_vm_stat,
    too_large,
)

RECORDED = Path(__file__).parent / "support" / "memory"


def _field_kb(text: str, name: str) -> int:
    """An independent read of one /proc/meminfo line."""
    [line] = [line for line in text.splitlines() if line.split(":")[0] == name]
    return int(line.split()[1])


def test_linux_available_is_memavailable() -> None:
    text = (RECORDED / "meminfo_linux.txt").read_text()
    memory = parse_meminfo(text)
    assert memory.total == _field_kb(text, "MemTotal") * 1024
    assert memory.available == _field_kb(text, "MemAvailable") * 1024
    assert memory.available != _field_kb(text, "MemFree") * 1024  # not the free pages alone


def test_macos_available_is_free_inactive_and_speculative_pages() -> None:
    vm_stat = (RECORDED / "vm_stat_macos.txt").read_text()
    memory = parse_vm_stat(vm_stat, (RECORDED / "hw_memsize_macos.txt").read_text())
    assert memory.total == 24 * GIB
    assert memory.available == (6853 + 386113 + 3420) * 16384


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("MemTotal:       24683656 kB\nMemFree:        19125076 kB\n", "MemAvailable"),
        ("Pages free: 1.\n", "page size"),
    ],
)
def test_unreadable_outputs_are_refused_by_name(text: str, missing: str) -> None:
    parse = parse_meminfo if "kB" in text else lambda t: parse_vm_stat(t, "1")
    with pytest.raises(ValueError, match=missing):
        parse(text)


def test_need_is_the_weights_on_disk_and_the_smallest_pool(tmp_path: Path) -> None:
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x" * 3000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "tokenizer.json").write_bytes(b"x" * 5000)
    assert need_of(tmp_path, 256) == Need(4000, 256 * MIB)


def test_too_large_says_what_to_do_and_fits_when_it_does() -> None:
    need = Need(weights=3 * GIB, kv=256 * MIB)
    memory = Memory(total=8 * GIB, available=2 * GIB)
    assert too_large("big", need, 4 * GIB, memory) is None
    reason = too_large("big", need, memory.available, memory)
    assert reason is not None
    for words in ("'big' needs about 3.25 GiB", "only 2.00 GiB", "smaller quantization"):
        assert words in reason
    assert "--max-loaded-models" in reason and "--keep-alive" in reason

"""What this machine's CPU is, from /proc/cpuinfo: its model name (baselines record it) and whether it has a
VNNI-class int8 dot product (int8 quantisation picks its weight range by it); and where its caches live."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# Flags of the x86 extensions that multiply u8 x s8 without the 16-bit intermediate sum that can saturate.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_model() -> str:
    """The CPU model name (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_vnni(cpuinfo: Path = CPUINFO) -> bool | None:
    """Whether this CPU has a VNNI-class int8 dot product (AVX512-VNNI, AVX-VNNI or AMX), from `cpuinfo`'s flags.

    None when it cannot tell: no readable `/proc/cpuinfo` (not Linux) or no x86 `flags` line in it (ARM, ...).
    """
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.partition(":")[2].split()}
    if "avx2" not in flags and "sse2" not in flags:  # not an x86 flags list: nothing to conclude
        return None
    return any(flag in flags for flag in VNNI_FLAGS)


def cache_root() -> Path:
    """`$COMPRESSOR_CACHE` (default `~/.cache/compressor`): the base fine-tunes and latency tables of this machine."""
    return Path(os.environ.get("COMPRESSOR_CACHE", Path.home() / ".cache" / "compressor"))

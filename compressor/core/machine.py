"""What this machine's CPU is, from /proc/cpuinfo: its model name (baselines record it) and whether it has a
VNNI-class int8 dot product (int8 quantisation picks its weight range by it); and where its caches live."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# Flags of the x86 extensions that multiply u8 x s8 without the 16-bit intermediate sum that can saturate.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


# Flags of the x86 extensions that multiply bf16 natively (AMX tiles, AVX512-BF16 dot products): where autocast in
# bf16 is faster than fp32; without them bf16 is converted in software and is slower.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_model() -> str:
    """The CPU model name (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The flags that change what our numbers are: the fp32 GEMM width (AVX2 / AVX-512) and the int8 dot product.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def _cpuinfo_field(cpuinfo: Path, key: str) -> str | None:
    """The first `key : value` of `cpuinfo` (None when unreadable or absent)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


# oneDNN's ISA cap (read by PyTorch's oneDNN and by OpenVINO's CPU plugin): a CPU run with it set is treated as the
# CPU it caps to, so compressor's own choices (int8 weight range, which int8 runtimes can pay) match the kernels.
ISA_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
_ABOVE_AVX2 = ("avx512", "avx_vnni", "amx")
# Per cap value: the flag prefixes a CPU run under it no longer has (oneDNN's ISAs are masks: the AVX-512 ones below
# AMX do not include AVX-VNNI).
_ISA_CAPS: dict[str, tuple[str, ...]] = {
    "SSE41": ("avx", "fma", *_ABOVE_AVX2),
    "AVX": ("avx2", "fma", *_ABOVE_AVX2),
    "AVX2": _ABOVE_AVX2,
    "AVX2_VNNI": ("avx512", "amx"),
    "AVX2_VNNI_2": ("avx512", "amx"),
    "AVX512_CORE": ("avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx"),
    "AVX512_CORE_VNNI": ("avx512_bf16", "avx512_fp16", "avx_vnni", "amx"),
    "AVX512_CORE_BF16": ("avx512_fp16", "avx_vnni", "amx"),
    "AVX512_CORE_FP16": ("avx_vnni", "amx"),
}


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str] | None:
    """This CPU's x86 feature flags, less those above `$ONEDNN_MAX_CPU_ISA` where it is set (a cap this CPU's math
    libraries run under); None when it cannot tell (no /proc/cpuinfo, or not an x86 flags list)."""
    flags = set((_cpuinfo_field(cpuinfo, "flags") or "").split())
    if not {"avx2", "sse2"} & flags:
        return None
    removed = _ISA_CAPS.get(isa_cap() or "", ())
    return {flag for flag in flags if not flag.startswith(removed)}


def cpu_has_vnni(cpuinfo: Path = CPUINFO) -> bool | None:
    """Whether this CPU has a VNNI-class int8 dot product (AVX512-VNNI, AVX-VNNI or AMX), from `cpuinfo`'s flags.

    None when it cannot tell: no readable `/proc/cpuinfo` (not Linux) or no x86 `flags` line in it (ARM, ...).
    """
    return _vnni(cpu_flags(cpuinfo))


def cpu_has_bf16(cpuinfo: Path = CPUINFO) -> bool | None:
    """Whether this CPU multiplies bf16 natively (AMX-BF16 or AVX512-BF16); None when its flags are unknown."""
    flags = cpu_flags(cpuinfo)
    return None if flags is None else any(flag in flags for flag in BF16_FLAGS)


def above_avx2(cpuinfo: Path = CPUINFO) -> bool | None:
    """Whether this CPU, as its math libraries run (under `$ONEDNN_MAX_CPU_ISA` where set), has anything an AVX2 cap
    takes away (AVX-512, AVX-VNNI, AMX); None when its flags are unknown. Where it has not, a run capped at AVX2 is
    the same run as one without the cap (`make test-avx2` says so and runs nothing twice)."""
    flags = cpu_flags(cpuinfo)
    return None if flags is None else any(flag.startswith(_ABOVE_AVX2) for flag in flags)


def _vnni(flags: set[str] | None) -> bool | None:
    """Whether `flags` include a VNNI-class int8 dot product (None when the flags are unknown)."""
    return None if flags is None else any(flag in flags for flag in VNNI_FLAGS)


def cpu_identity(cpuinfo: Path = CPUINFO) -> str:
    """The CPU as far as our numbers are concerned: its model name and the flags that matter. Virtual machines often
    report a bare brand name ("AMD EPYC") for CPUs with and without AVX-512 or VNNI; absolute throughputs and
    latency tables are only comparable between machines whose identity is equal."""
    flags = cpu_flags(cpuinfo)
    known = "flags unknown" if flags is None else " ".join(f for f in SPEED_FLAGS if f in flags) or "no AVX2"
    cap = isa_cap()
    return f"{cpu_model()} [{known}]" + (f" capped at {cap}" if cap else "")


def isa_cap() -> str | None:
    """The ISA `$ONEDNN_MAX_CPU_ISA` caps this process's math libraries to, where it names one this module knows."""
    cap = os.environ.get(ISA_CAP_ENV, "").strip().upper()
    return cap if cap in _ISA_CAPS else None


def cpu_generation(cpuinfo: Path = CPUINFO) -> str | None:
    """The x86 family and model numbers ("family 26 model 2"), None where `cpuinfo` lacks them: virtual machines often
    name only the brand ("AMD EPYC"), and these tell the generations under one name apart (Zen 4 is family 25, Zen 5
    family 26), whose kernels and cost ratios differ."""
    cpu_family, model = _cpuinfo_field(cpuinfo, "cpu family"), _cpuinfo_field(cpuinfo, "model")
    return f"family {cpu_family} model {model}" if cpu_family and model else None


def cpu_summary(cpuinfo: Path = CPUINFO) -> dict:
    """What a figure was measured on: CPU model, x86 generation and vendor, the flags that matter (`SPEED_FLAGS`),
    usable cores."""
    flags = cpu_flags(cpuinfo)
    return {
        "model": cpu_model(),
        "generation": cpu_generation(cpuinfo),
        "vendor": _cpuinfo_field(cpuinfo, "vendor_id") or platform.machine(),
        "flags": None if flags is None else [f for f in SPEED_FLAGS if f in flags],
        "vnni": _vnni(flags),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }


INT8_FEATURES = (
    ("avx2", "AVX2"),
    ("avx512f", "AVX-512"),
    ("avx512_vnni", "VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("amx_int8", "AMX"),
)


def int8_features(summary: dict | None = None) -> str:
    """The CPU's features that decide what int8 gains, in words ("AVX2, AVX-512, VNNI, AMX": those present; "no
    AVX2" or "flags unknown"), from a `cpu_summary` (this machine's by default). int8 runtimes pay differently per
    CPU (OpenVINO's int8 kernels need VNNI or AMX), so every int8 figure is printed beside these."""
    summary = cpu_summary() if summary is None else summary
    if summary.get("flags") is None:
        return "flags unknown"
    flags = set(summary["flags"])
    return ", ".join(word for flag, word in INT8_FEATURES if flag in flags) or "no AVX2"


def cache_root() -> Path:
    """`$COMPRESSOR_CACHE` (default `~/.cache/compressor`): the base fine-tunes and latency tables of this machine."""
    return Path(os.environ.get("COMPRESSOR_CACHE", Path.home() / ".cache" / "compressor"))


def machine_info() -> dict:
    """Platform, Python and library versions, and the load average: what a benchmark result records beside it."""
    import onnxruntime
    import torch
    import transformers

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }

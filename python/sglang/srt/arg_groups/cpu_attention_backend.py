"""The attention backend on CPU: the default when none is given, and Gemma-4's and
Gemma-3n's check of a given one, with a message that names what runs on that device.

The CPU default is decided before the other settings, so they see the backend that will
run: intel_amx falls back to torch_native on a CPU without AMX only late, after the rule
that turns CUDA graphs off for torch_native, and a launch without --attention-backend then
died in a prefill graph op that has no CPU kernel."""
from __future__ import annotations

from typing import Iterable, Optional

GEMMA4 = ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM",
          "Gemma4UnifiedForConditionalGeneration")
GEMMA3N = ("Gemma3nForCausalLM", "Gemma3nForConditionalGeneration")
# torch_native runs their attention on any CPU (sliding window, per-layer head sizes,
# KV-shared layers); triton runs it through Triton's interpreter (TRITON_INTERPRET=1).
CPU_BACKENDS = ("torch_native", "triton")
CPU_NOTES = {"torch_native": "the default on CPU", "triton": "through Triton's interpreter"}


def default_cpu_attention_backend(architectures: Iterable[str], amx: bool, arm64: bool) -> str:
    """torch_native on ARM, on a CPU without AMX and for Gemma-4 and Gemma-3n; else
    intel_amx (stock's default on x86)."""
    if arm64 or not amx or any(a in GEMMA4 + GEMMA3N for a in architectures):
        return "torch_native"
    return "intel_amx"


def check_gemma_attention_backends(arch: str, device: str, prefill: str, decode: str,
                                   gpu_backends: Optional[tuple] = None) -> None:
    """Refuse an attention backend the model does not run on, naming the ones it does
    on this device. ``gpu_backends``: the model's list off CPU (None: no check there);
    on CPU, the CPU backends and those of that list that run on CPU."""
    if device == "cpu":
        accepted = CPU_BACKENDS + tuple(b for b in gpu_backends or () if b == "intel_amx")
    elif gpu_backends is None:
        return
    else:
        accepted = tuple(gpu_backends)
    if prefill in accepted and decode in accepted:
        return
    if device == "cpu":
        names = ", ".join(f"{b} ({CPU_NOTES[b]})" if b in CPU_NOTES else b for b in accepted)
        where = "CPU"
    else:
        names, where = ", ".join(accepted), device
    raise ValueError(
        f"{arch} runs on {where} with the attention backends {names}; got prefill={prefill}, "
        f"decode={decode}. Leave --attention-backend unset for its default, or pass one of "
        "these.")

"""The lab's rule for the desktop ("cockpit"): no local training or inference, ever.

Two pieces of evidence, both read-only: GPU compute processes from ``nvidia-smi`` (any CUDA
process is compute; graphics clients such as Xorg are not listed by --query-compute-apps)
and known model servers / training launchers in the process list. Either is CRITICAL with
the process named. The list is deliberately explicit (docs/fleet.md) rather than a guess
such as "any python importing torch", which ps cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass

from alma.fleet.parsers import GpuProcess, ParseError, Process, missing_command, parse_compute_apps, parse_ps
from alma.fleet.severity import Severity

GPU_APPS_COMMAND = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"
PS_COMMAND = "ps -eo pid=,args="
CHECK_NAME = "no-local-ai"

# Executable names (basename of argv[0]) of model servers and training launchers.
MODEL_SERVER_EXES = frozenset(
    {
        "ollama",  # Ollama server ("ollama serve") and CLI runner
        "ollama_llama_server",  # Ollama's per-model runner
        "llama-server",  # llama.cpp HTTP server
        "llama-cli",  # llama.cpp interactive inference
        "vllm",  # vLLM CLI ("vllm serve MODEL")
        "text-generation-launcher",  # Hugging Face TGI
        "text-generation-server",
        "tritonserver",  # NVIDIA Triton
        "local-ai",  # LocalAI
        "koboldcpp",
        "torchrun",  # PyTorch distributed training launcher
        "deepspeed",
        "accelerate",  # "accelerate launch train.py"
    }
)
# Python-hosted servers/launchers run as "python3 -m <module>": matched in the arguments.
MODEL_SERVER_MODULES = (
    "vllm.entrypoints",
    "sglang.launch_server",
    "text_generation_server",
    "llama_cpp.server",
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed.launcher",
)


@dataclass
class Offender:
    pid: int
    name: str
    why: str  # "GPU compute process (1.5 GiB)" | "model server"

    def describe(self) -> str:
        return f"{self.name} (pid {self.pid}): {self.why}"


def find_model_servers(procs: list[Process]) -> list[Offender]:
    out = []
    for p in procs:
        if p.args.startswith("["):
            continue  # kernel thread
        if p.exe in MODEL_SERVER_EXES:
            out.append(Offender(p.pid, p.exe, "known model server / training launcher"))
            continue
        hit = next((m for m in MODEL_SERVER_MODULES if m in p.args), None)
        if hit:
            out.append(Offender(p.pid, f"{p.exe} -m {hit}", "known model server / training launcher"))
    return out


def _gpu_offenders(apps: list[GpuProcess]) -> list[Offender]:
    out = []
    for a in apps:
        mem = "memory not reported" if a.used_bytes is None else f"{a.used_bytes / 1024**2:.0f} MiB"
        out.append(Offender(a.pid, a.name.rsplit("/", 1)[-1], f"GPU compute process ({mem})"))
    return out


def evaluate(gpu_rc: int | None, gpu_text: str, gpu_error: str | None, ps_rc: int | None, ps_text: str,
             ps_error: str | None) -> tuple[Severity, str]:  # fmt: skip
    """Status and one-line summary of the lab rule from the two commands' results."""
    offenders: list[Offender] = []
    unknown: list[str] = []
    notes: list[str] = []

    if gpu_error:
        unknown.append(f"GPU processes not checked: {gpu_error}")
    elif missing_command(gpu_rc, gpu_text):
        # No nvidia-smi means no NVIDIA driver: no CUDA compute is possible on this machine.
        notes.append("no nvidia-smi (no NVIDIA driver)")
    elif gpu_rc != 0:
        last = next((ln for ln in reversed(gpu_text.splitlines()) if ln.strip()), "")
        unknown.append(f"nvidia-smi failed (exit {gpu_rc}): {last.strip()}")
    else:
        try:
            offenders += _gpu_offenders(parse_compute_apps(gpu_text))
        except ParseError as exc:
            unknown.append(str(exc))

    if ps_error:
        unknown.append(f"processes not checked: {ps_error}")
    elif ps_rc != 0:
        unknown.append(f"ps failed (exit {ps_rc})")
    else:
        try:
            known = {o.pid for o in offenders}
            offenders += [o for o in find_model_servers(parse_ps(ps_text)) if o.pid not in known]
        except ParseError as exc:
            unknown.append(str(exc))

    if offenders:
        return Severity.CRITICAL, "local AI on the desktop: " + "; ".join(o.describe() for o in offenders)
    if unknown:
        return Severity.UNKNOWN, "; ".join(unknown)
    return Severity.OK, "no GPU compute, no model server" + (f" ({', '.join(notes)})" if notes else "")

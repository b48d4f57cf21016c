"""What the benchmarks say of the machine they ran on: the CPU's name as lscpu gives it, and how busy all of
its CPUs were (to tell a quiet measurement from one that shared the machine)."""

from __future__ import annotations

import os
import platform
import subprocess


def cpu_name() -> str:
    """lscpu's model name (platform.processor() where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return platform.processor() or "?"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def machine_busy_s() -> float | None:
    """CPU-seconds all CPUs of the machine spent busy since boot (steal included: a VM's vCPU
    waiting for its host is contention too); None without /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = v + [0] * (8 - len(v))
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

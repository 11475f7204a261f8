"""How many of this process's cores other processes keep busy: what llama.cpp's thread count
follows when it is not set (:class:`~rag_gym.generation.llama_cpp.LlamaCppLM`).

llama.cpp's threads wait for each other at every step of a matrix product, so a thread that
shares its core with another busy process holds all the others up: more threads than idle
cores is slower than fewer (docs/results/speed.md has the measurements). So the default thread
count is the cores this process may use less those that other processes kept busy lately, at
least 1.

:class:`CpuMeter` reads the kernel's per-CPU time counters (``/proc/stat``, Linux) for the CPUs
this process may run on, and takes this process's own CPU time out of their busy time. Where
the counters cannot be read, or a CPU quota (cgroup ``cpu.max``) makes them say nothing about
the cores this process gets, it reports nothing and the thread count stays at every core.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STAT = Path("/proc/stat")
QUOTA = Path("/sys/fs/cgroup/cpu.max")


def _quota_limited() -> bool:
    try:
        return QUOTA.read_text().split()[0] != "max"
    except (OSError, IndexError):
        return False


def read_counters(stat: str, cpus: set[int]) -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks summed over ``cpus`` from ``/proc/stat``'s text (``idle``
    and ``iowait`` are the idle time), or ``None`` when a CPU is missing."""
    busy = total = 0
    seen = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            cpu = int(name[3:])
            fields = [int(x) for x in rest.split()[:8]]
        except ValueError:
            return None
        if cpu not in cpus or len(fields) < 5:
            continue
        seen += 1
        t = sum(fields)
        total += t
        busy += t - fields[3] - fields[4]
    return (busy, total) if seen == len(cpus) else None


def others_busy(busy_ticks: int, own_seconds: float, wall: float, tick: float) -> float:
    """Cores other processes kept busy over ``wall`` seconds: the CPUs' busy ticks (``tick``
    seconds each) less this process's own CPU seconds, per second."""
    if wall <= 0:
        return 0.0
    return max(0.0, busy_ticks * tick - own_seconds) / wall


class CpuMeter:
    """Cores that other processes kept busy since the last reading (see the module doc)."""

    def __init__(self) -> None:
        self.cpus = _affinity()
        self.usable = len(self.cpus) or os.cpu_count() or 1
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self._last = self._read() if self.cpus and not _quota_limited() else None
        self.works = self._last is not None

    def _read(self) -> tuple[float, int, float] | None:
        try:
            counters = read_counters(STAT.read_text(), self.cpus)
        except OSError:
            return None
        if counters is None:
            return None
        return time.monotonic(), counters[0], time.process_time()

    def others(self) -> float | None:
        """Cores other processes kept busy since the last call (or since this meter was made);
        ``None`` where the counters say nothing."""
        if self._last is None:
            return None
        now = self._read()
        if now is None:
            return None
        t0, busy0, own0 = self._last
        self._last = now
        return others_busy(now[1] - busy0, now[2] - own0, now[0] - t0, self.tick)

    def threads(self, others: float | None) -> int:
        """Threads for llama.cpp given ``others`` busy cores: the usable cores less them
        (rounded), at least 1; every usable core when ``others`` is ``None``."""
        if others is None:
            return self.usable
        return max(1, min(self.usable, round(self.usable - others)))


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set()

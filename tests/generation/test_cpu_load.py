"""llama.cpp's thread count follows the machine's load, and does not change the text."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rag_gym.generation.cpu_load import CpuMeter, others_busy, read_counters
from rag_gym.generation.lm import GenerationConfig
from tests.conftest import requires_llama

STAT = """cpu  900 0 100 2000 0 0 0 0 0 0
cpu0 400 0 50 1000 10 0 0 0 0 0
cpu1 500 0 50 1000 0 0 0 0 0 0
cpu2 1 0 1 1 0 0 0 0 0 0
intr 1 2 3
"""


def test_counters_sum_the_usable_cpus_only():
    # busy = every field but idle and iowait
    assert read_counters(STAT, {0, 1}) == (400 + 50 + 500 + 50, 1460 + 1550)
    assert read_counters(STAT, {2}) == (2, 3)
    assert read_counters(STAT, {0, 7}) is None  # a CPU the file does not list
    assert read_counters("cpu0 x y\n", {0}) is None


def test_other_processes_busy_cores_exclude_this_process():
    # 2 s of wall time, 300 busy ticks of 10 ms = 3 CPU-seconds, 1 of them this process's
    assert others_busy(300, 1.0, 2.0, 0.01) == pytest.approx(1.0)
    assert others_busy(100, 1.5, 2.0, 0.01) == 0.0  # never below 0
    meter = CpuMeter()
    meter.usable = 2
    assert [meter.threads(x) for x in (0.0, 0.4, 0.6, 1.0, 1.9, 5.0, None)] == [2, 2, 1, 1, 1, 1, 2]


def test_a_busy_process_is_counted():
    meter = CpuMeter()
    if not meter.works:
        pytest.skip("no per-CPU counters here (/proc/stat) or a CPU quota hides them")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        meter.others()
        time.sleep(1.5)
        others = meter.others()
    finally:
        busy.kill()
        busy.wait()
    assert others is not None and others >= 0.8  # the loop kept about one core busy
    assert meter.threads(others) <= max(1, meter.usable - 1)


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_the_thread_count_does_not_change_greedy_text():
    """Greedy replies with 1 and with 2 threads, and with the count changed between calls of
    one model (its cached prefixes reused), are the same text."""
    from rag_gym.agents.search_r1 import checkpoint_path
    from rag_gym.generation import llama_compat as compat
    from rag_gym.generation.adapters import adapter_gguf
    from rag_gym.generation.llama_cpp import LlamaCppLM

    adapter = adapter_gguf(checkpoint_path("synthhop"))
    prompts = [
        "<|im_start|>user\nQuestion: Who founded the city where the Lumen Archive is kept?"
        f"{extra}<|im_end|>\n<|im_start|>assistant\n"
        for extra in ("", " Think first.", " Think first, then search.")
    ]
    config = GenerationConfig(max_tokens=24)
    texts = {}
    for n in (1, 2):
        lm = LlamaCppLM(n_ctx=512, n_threads=n, adapter=adapter, kv_chunk=4)
        assert lm.threads == n
        texts[n] = [g[0].text for g in lm.generate(prompts, config)]
    assert texts[1] == texts[2]
    lm = LlamaCppLM(n_ctx=512, n_threads=2, adapter=adapter, kv_chunk=4)
    switched = []
    for i, prompt in enumerate(prompts):
        compat.set_threads(lm._llm, [], 1 + i % 2)
        switched.append(lm.generate([prompt], config)[0][0].text)
    assert switched == texts[1]
    assert lm.engine.stats["reused"] > 0

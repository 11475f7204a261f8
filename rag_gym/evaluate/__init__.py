"""Evaluate agents on an environment under one pinned protocol and build a leaderboard.

Every agent plays the *same* sampled questions: ``n`` question ids drawn without replacement by
``numpy.random.default_rng(seed)`` from the split, in index order. Agents that play another env
kind (R²AG's tree, ARENA's reader) play the same questions on the same dataset's env of their
kind (the reader skips unanswerable questions, which ARENA's setting does not have; the tree
env runs with ``prune="none"``, since no gold is known at test time). Episodes run ``batch_size``
at a time: each agent step is one batched call for all running episodes, or, with a backend that
batches concurrent callers (transformers), each episode goes on as soon as its own reply is done
(see :class:`~rag_gym.evaluate.scheduler.EpisodeScheduler`).

The run folder gets ``protocol.json`` (everything needed to re-run: dataset, split, question
ids, seed, env kwargs, retriever, k, corpus mode, model and backend spec, prompt versions,
command), ``episodes.jsonl``, the step traces ``steps.jsonl`` and ``passages.jsonl`` (every
step of every episode and each passage touched, once; schema in :mod:`rag_gym.traces`),
``leaderboard.csv``, ``leaderboard.md`` and two plots (``em_f1.png``: EM and F1 per agent;
``accuracy_vs_retrievals.png``: EM against the mean number of searches, as LWTS Figure 1).
``rag-gym evaluate`` then writes ``report.html`` (:mod:`rag_gym.view`).

Nothing finished is lost: ``protocol.json`` is written before the first episode, and each episode
is appended to ``episodes.jsonl`` (and flushed) as soon as it ends, its trace just before. A
failing episode (an agent or backend error, an env error in ``reset`` or ``step``, text that is
not valid Unicode) is recorded with its ``error`` and the run goes on; an ``OSError`` from the env
(an unreachable retrieval server, a missing file) and a ``ConnectionError`` from the agent's
backend (an LLM server that cannot be reached) stop the run, as Ctrl-C or SIGTERM do
(:class:`RunInterrupted`). A stopped run has a partial leaderboard and goes on with
``evaluate(..., resume=True)`` (``rag-gym evaluate --resume RUN``): only the missing episodes
are played, and those that failed for a reason outside the agent (:func:`replayable`: a
backend that timed out, say), each with the seed it would have had, so the final leaderboard is
the one an uninterrupted run writes. A run folder is never replaced silently: an existing one
needs ``resume`` or ``overwrite``, and ``overwrite`` deletes only a folder holding a
``protocol.json``.
"""

from rag_gym.evaluate.config import (
    EvalConfig,
    EvalResult,
    EvalRunner,
    check_run_dir,
    default_run_name,
)
from rag_gym.evaluate.leaderboard import (
    COLUMNS,
    format_cell,
    leaderboard_markdown,
    log_to_wandb,
    summarise,
    write_leaderboard,
    write_plots,
    write_run,
)
from rag_gym.evaluate.run_folder import (
    check_out_dir,
    check_resumable,
    is_run_folder,
    load_episodes,
    read_protocol,
    run_dir_of,
)
from rag_gym.evaluate.runner import (
    RunInterrupted,
    evaluate,
    evaluate_checkpoint,
    sigterm_as_interrupt,
)
from rag_gym.evaluate.scheduler import (
    EpisodeScheduler,
    env_id_for,
    make_env,
    replayable,
    run_agent,
    sample_indices,
)

__all__ = [
    "COLUMNS",
    "EpisodeScheduler",
    "EvalConfig",
    "EvalResult",
    "EvalRunner",
    "RunInterrupted",
    "check_out_dir",
    "check_resumable",
    "check_run_dir",
    "default_run_name",
    "env_id_for",
    "evaluate",
    "evaluate_checkpoint",
    "format_cell",
    "is_run_folder",
    "leaderboard_markdown",
    "load_episodes",
    "log_to_wandb",
    "make_env",
    "read_protocol",
    "replayable",
    "run_agent",
    "run_dir_of",
    "sample_indices",
    "sigterm_as_interrupt",
    "summarise",
    "write_leaderboard",
    "write_plots",
    "write_run",
]

"""Names: checking one against the known ones, with "did you mean …", and the default name of a
run folder (one helper each for the package)."""

from __future__ import annotations

import difflib
import secrets
import time
from collections.abc import Iterable


def unknown_name(
    what: str, name: object, known: Iterable[str], aliases: Iterable[str] = ()
) -> ValueError:
    """The ``ValueError`` for an unknown ``name``: "expected a <what> in [...], got 'x'; did you mean 'y'?".

    >>> str(unknown_name("dataset", "musiqe", ["musique", "hotpotqa"]))
    "expected a dataset in ['hotpotqa', 'musique'], got 'musiqe'; did you mean 'musique'?"
    """
    known = sorted(known)
    close = difflib.get_close_matches(str(name), [*known, *aliases], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ValueError(f"expected a {what} in {known}, got {name!r}{hint}")


def run_name(env_id: str, stage: str, seed: int) -> str:
    """The default name of a run folder, for every command that writes one:
    ``<env>__<stage>__<seed>__<unix time>.<microseconds>-<random hex>`` (``<env>`` without its
    ``rag_gym/`` namespace; ``<stage>`` the split evaluated, or the training stage). Names sort
    by start time, and two runs started in the same microsecond still differ.

    >>> run_name("rag_gym/SynthHop-v0", "sft", 0).split("__")[:3]
    ['SynthHop-v0', 'sft', '0']
    """
    t = time.time_ns()
    stamp = f"{t // 10**9}.{t // 1000 % 10**6:06d}-{secrets.token_hex(2)}"
    return f"{env_id.split('/')[-1]}__{stage}__{seed}__{stamp}"

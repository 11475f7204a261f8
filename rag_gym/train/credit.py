"""Per-turn credit: each model turn's tokens get an advantage of their own, from the env's
per-step rewards.

An episode of a text-action env is a chain of model turns, each one env step with its reward
``r_t`` (EVO-RAG's step cost and retrieval terms, Eval-RAR's evaluation reward, the answer
reward on the last step…). GRPO (Shao et al., 2024, "DeepSeekMath", §4.1.2) gives every token
of an episode the same advantage, its return normalised within the group of ``G`` episodes of
one question, ``A_i = (R_i - mean_g R) / (std_g R + eps)``: the ``"episode"`` mode. The two
others give each turn ``t`` of episode ``i`` its own advantage ``A_{i,t}``, from the discounted
return from that turn on, ``G_{i,t} = sum_{s >= t} gamma^(s - t) r_{i,s}``:

* ``"turn"``: ``A_{i,t} = A_i + (G_{i,t} - R_i) / scale_g``, where ``R_i = sum_t r_{i,t}``
  and ``scale_g`` is the divisor of ``A_i`` (``std_g R + 1e-4``, as TRL scales a group; 1 when
  the group's returns are all equal or the trainer does not scale). That is the group-normalised
  return from the turn on, ``(G_{i,t} - mean_g R) / scale_g``, written so that a turn whose
  return from it on is the episode's (a reward on the last step only, ``gamma`` = 1) gets
  ``A_i`` exactly, and a group that dynamic sampling trains with zero advantage keeps only the
  differences between its turns.
* ``"gigpo"``: GiGPO's two-level advantage (Feng et al., 2025, "Group-in-Group Policy
  Optimization for LLM Agent Training"), ``A_{i,t} = A_i + omega * A^S_{i,t}``.
  The step advantage compares turns taken from the same *anchor state* across the group's
  episodes: ``A^S_{i,t} = (G_{i,t} - mean) / (std + 1e-6)`` over every turn ``(j, s)`` of the
  group whose anchor is that of ``(i, t)`` (0 for a turn no other shares). A turn's anchor is
  what the env has shown the model before it (:func:`anchor`): the first turn's is the
  question's, shared by the whole group; a later turn shares one with another episode's turn
  when the same searches returned the same passages. The paper weighs the two levels 1:1
  (``omega`` = 1).

Tokens the env wrote (observations, the end token) get advantage 0; only the model's tokens are
trained (their ``env_mask`` is 1).
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Sequence

MODES = ("episode", "turn", "gigpo")

#: the ``eps`` added to a step group's standard deviation
STEP_EPS = 1e-6


def anchor(observations: Sequence[str]) -> str:
    """The anchor state of a turn: a digest of the observations the env has shown before it
    (for the first turn, the question's prompt alone)."""
    digest = hashlib.sha1()
    for text in observations:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def returns_to_go(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}`` for each turn ``t`` (the last turn's is its reward).

    >>> returns_to_go([-0.1, -0.1, 1.0])
    [0.8, 0.9, 1.0]
    >>> returns_to_go([0.0, 0.0, 1.0], gamma=0.5)
    [0.25, 0.5, 1.0]
    """
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def _std(values: Sequence[float]) -> float:
    """The unbiased standard deviation (0 for fewer than two values), as ``torch.std``."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def group_scales(
    returns: Sequence[float], group_size: int, scale_rewards: str = "group"
) -> list[float]:
    """Each episode's GRPO divisor, as TRL scales its advantage (``scale_rewards``): ``std +
    1e-4`` of its group's returns (``"group"``) or of the batch's (``"batch"``); 1 where that
    standard deviation is 0 or with ``"none"``.

    >>> group_scales([1.0, 0.0, 0.5, 0.5], 2)
    [0.7072067811865476, 0.7072067811865476, 1.0, 1.0]
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(
            f"expected scale_rewards 'group', 'batch' or 'none', got {scale_rewards!r}"
        )
    n = len(returns)
    if scale_rewards == "none":
        return [1.0] * n
    size = n if scale_rewards == "batch" else group_size
    scales = []
    for start in range(0, n, size):
        std = _std(returns[start : start + size])
        scales += [std + 1e-4 if std > 1e-8 else 1.0] * len(returns[start : start + size])
    return scales


def turn_advantages(
    mode: str,
    episode_advantages: Sequence[float],
    scales: Sequence[float],
    turn_rewards: Sequence[Sequence[float]],
    anchors: Sequence[Sequence[str]],
    group_size: int,
    gamma: float = 1.0,
    omega: float = 1.0,
) -> list[list[float]]:
    """Each turn's advantage, ``[episode][turn]``, in ``mode`` (``"turn"`` or ``"gigpo"``; see
    the module docstring). ``episode_advantages`` and ``scales``: each episode's GRPO advantage
    and its divisor; episodes ``k * group_size`` to ``(k + 1) * group_size - 1`` are one group.

    >>> turn_advantages("turn", [1.0, -1.0], [0.5, 0.5], [[-0.1, 1.0], [-0.1, 0.0]],
    ...                 [["q", "a"], ["q", "b"]], group_size=2)
    [[1.0, 1.2], [-1.0, -0.8]]
    """
    if mode not in ("turn", "gigpo"):
        raise ValueError(f"expected mode 'turn' or 'gigpo', got {mode!r}")
    n = len(turn_rewards)
    if not (len(episode_advantages) == len(scales) == len(anchors) == n):
        raise ValueError("expected one advantage, scale, reward list and anchor list per episode")
    if group_size < 1 or n % group_size:
        raise ValueError(f"expected episodes in groups of {group_size}, got {n} episodes")
    togo = [returns_to_go(rewards, gamma) for rewards in turn_rewards]
    if mode == "turn":
        return [
            [
                float(episode_advantages[i]) + (g - sum(turn_rewards[i])) / float(scales[i])
                for g in togo[i]
            ]
            for i in range(n)
        ]
    step = [[0.0] * len(g) for g in togo]
    for start in range(0, n, group_size):
        shared: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i in range(start, start + group_size):
            if len(anchors[i]) != len(togo[i]):
                raise ValueError(f"expected one anchor per turn, episode {i}")
            for t, key in enumerate(anchors[i]):
                shared[key].append((i, t))
        for turns in shared.values():
            if len(turns) < 2:
                continue
            values = [togo[i][t] for i, t in turns]
            mean = sum(values) / len(values)
            std = _std(values)
            for i, t in turns:
                step[i][t] = (togo[i][t] - mean) / (std + STEP_EPS)
    return [[float(episode_advantages[i]) + omega * a for a in step[i]] for i in range(n)]


def token_advantages(
    turn_values: Sequence[Sequence[float]],
    turn_spans: Sequence[Sequence[tuple[int, int]]],
    width: int,
) -> list[list[float]]:
    """Each completion token's advantage, rows of ``width``: the tokens of turn ``t`` (its
    span ``[start, end)`` of the completion) get ``turn_values[i][t]``, every other token 0.

    >>> token_advantages([[0.5, -1.0]], [[(0, 2), (4, 5)]], width=6)
    [[0.5, 0.5, 0.0, 0.0, -1.0, 0.0]]
    """
    rows = []
    for values, spans in zip(turn_values, turn_spans, strict=True):
        if len(values) != len(spans):
            raise ValueError(
                f"expected one value per turn span, got {len(values)} and {len(spans)}"
            )
        row = [0.0] * width
        for value, (start, end) in zip(values, spans, strict=True):
            for k in range(max(0, start), min(end, width)):
                row[k] = float(value)
        rows.append(row)
    return rows

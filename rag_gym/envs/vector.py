"""``SearchVectorEnv``: N search episodes stepped in one process, their searches retrieved together.

The native vector entry point of every search id (``rag_gym/<Name>-v0``), as Gymnasium's own
vectorised classic-control envs have one::

    envs = gym.make_vec("rag_gym/SynthHop-v0", num_envs=8, vectorization_mode="vector_entry_point")

It holds ``num_envs`` :class:`~rag_gym.envs.SearchEnv` copies (built with the same data
arguments, so they share one corpus and index) and, each step, makes the SEARCH queries of all of
them in one batched ``retrieve`` call. A ``SyncVectorEnv`` calls ``retrieve`` once per sub-env
and an ``AsyncVectorEnv`` pays inter-process traffic on every step; both cost more than a
numba-kernel BM25 search of a 100k-passage corpus. ``python benchmarks/vector_envs.py`` compares
the three.

Episodes are exactly those of ``gym.make(id)`` sub-envs in a ``SyncVectorEnv`` with the same
seeds and actions (tested): the same observations, rewards, flags and infos, each sub-env's step
limit applied as ``TimeLimit`` applies it (``max_episode_steps``, default the id's registered
horizon), and Gymnasium 1.x's next-step autoreset (``AutoresetMode.NEXT_STEP``): the step after
an episode ends resets that sub-env, ignores its action and returns its first observation with
reward 0 and both flags false.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, iterate

from rag_gym.envs.base import DataConfig, SearchRequest, check_int, retrieve_all
from rag_gym.envs.search import SearchEnv


class SearchVectorEnv(VectorEnv):
    """``num_envs`` :class:`~rag_gym.envs.SearchEnv` episodes, batched retrieval per step.

    Observations are a tuple of strings, actions ``{"type": int array, "text": tuple of str}``,
    infos Gymnasium's batched dicts (each key with its ``_key`` mask), as from
    ``gym.make_vec(..., vectorization_mode="sync")``.

    Args:
        num_envs: how many episodes run side by side.
        max_episode_steps: each sub-env's step limit (``None``: none); ``gym.make_vec`` passes
            the id's registered one (20).
        render_mode: as for :class:`~rag_gym.envs.SearchEnv`; ``render()`` returns one
            rendering per sub-env.
        data, **kwargs: the :class:`~rag_gym.envs.SearchEnv` arguments, the same for every
            sub-env.

    >>> import gymnasium as gym, rag_gym
    >>> envs = gym.make_vec("rag_gym/SynthHop-v0", num_envs=3, vectorization_mode="vector_entry_point",
    ...                     dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
    >>> obs, info = envs.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = envs.step(
    ...     {"type": np.zeros(3, dtype=np.int64), "text": tuple(info["question"])})
    >>> [len(ids) for ids in info["retrieved_ids"]], terminated.tolist()
    ([3, 3, 3], [False, False, False])
    """

    metadata = {  # noqa: RUF012 (Gymnasium's VectorEnv declares it a plain class attribute)
        "render_modes": SearchEnv.metadata["render_modes"],
        "autoreset_mode": AutoresetMode.NEXT_STEP,
    }

    def __init__(
        self,
        num_envs: int,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        data: DataConfig | None = None,
        **kwargs: Any,
    ) -> None:
        check_int("num_envs", num_envs, 1)
        if max_episode_steps is not None:
            check_int("max_episode_steps", max_episode_steps, 1)
        self.num_envs = int(num_envs)
        self.max_episode_steps = max_episode_steps
        self.render_mode = render_mode
        self.envs = [
            SearchEnv(data, render_mode=render_mode, **kwargs) for _ in range(self.num_envs)
        ]
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._env_obs: list[Any] = [None] * self.num_envs
        #: the last observations: a tuple of strings, as ``SyncVectorEnv`` returns for a text
        #: space, and immutable, so returned as it is (``SyncVectorEnv`` deep-copies its tuple,
        #: which for strings gives back the same tuple)
        self._observations: tuple[str, ...] = ("",) * self.num_envs
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._autoreset_envs = np.zeros(self.num_envs, dtype=np.bool_)
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)

    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every sub-env (or those of ``options["reset_mask"]``); an int ``seed`` seeds
        sub-env ``i`` with ``seed + i``, as Gymnasium's vector envs do."""
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(
                    f"expected {self.num_envs} seeds (one per sub-env), got {len(seeds)}"
                )
        options = dict(options) if options else None
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
                raise TypeError("expected options['reset_mask'] to be a numpy bool array")
            if mask.shape != (self.num_envs,) or not mask.any():
                raise ValueError(
                    f"expected options['reset_mask'] of shape ({self.num_envs},) with a True"
                )
        infos: list[dict[str, Any] | None] = [None] * self.num_envs
        for i in np.flatnonzero(mask):
            self._env_obs[i], infos[i] = self.envs[i].reset(seed=seeds[i], options=options)
            self._elapsed[i] = 0
        self._terminations[mask] = False
        self._truncations[mask] = False
        self._autoreset_envs[mask] = False
        self._observations = tuple(self._env_obs)
        return self._observations, self._batch_infos(infos)

    def step(self, actions: dict[str, Any]):
        """Step every sub-env; the SEARCH queries of the step go to the retriever together."""
        actions = self._unbatch(actions)
        stepping = [i for i in range(self.num_envs) if not self._autoreset_envs[i]]
        checked: dict[int, tuple[int, str]] = {}
        requests: dict[int, SearchRequest] = {}
        for i in stepping:  # every action is checked before any sub-env moves
            env = self.envs[i]
            env._check_running()
            checked[i] = env._validate(actions[i])
            request = env._request_for(*checked[i])
            if request is not None:
                requests[i] = request
        retrieved = dict(
            zip(
                requests,
                retrieve_all(self.envs[0].retriever, list(requests.values())),
                strict=True,
            )
        )
        infos: list[dict[str, Any] | None] = [None] * self.num_envs
        rewards = self._rewards
        terminations, truncations = self._terminations, self._truncations
        for i, env in enumerate(self.envs):
            if i not in checked:
                self._env_obs[i], info = env.reset()
                self._elapsed[i] = 0
                rewards[i] = 0.0
                terminations[i] = truncations[i] = False
            else:
                obs, reward, terminated, truncated, info = env._apply(*checked[i], retrieved.get(i))
                self._elapsed[i] += 1
                if (
                    self.max_episode_steps is not None
                    and self._elapsed[i] >= self.max_episode_steps
                ):
                    truncated = True  # as gymnasium.wrappers.TimeLimit
                self._env_obs[i] = obs
                rewards[i] = reward
                terminations[i] = terminated
                truncations[i] = truncated
            infos[i] = info
        self._observations = tuple(self._env_obs)  # immutable: no copy to make
        self._autoreset_envs = terminations | truncations
        return (
            self._observations,
            rewards.copy(),
            terminations.copy(),
            truncations.copy(),
            self._batch_infos(infos),
        )

    def _unbatch(self, actions: Any) -> list[dict[str, Any]]:
        """One action dict per sub-env: ``iterate(self.action_space, actions)``, with a direct
        path for the usual batch (an int array and a tuple or list of strings)."""
        n = self.num_envs
        if type(actions) is dict and len(actions) == 2:
            types, texts = actions.get("type"), actions.get("text")
            if (
                isinstance(types, np.ndarray)
                and types.shape == (n,)
                and type(texts) in (tuple, list)
                and len(texts) == n
            ):
                return [{"type": t, "text": s} for t, s in zip(types, texts, strict=True)]
        out = list(iterate(self.action_space, actions))
        if len(out) != n:
            raise ValueError(f"expected {n} actions, got {len(out)}")
        return out

    def _batch_infos(self, infos: list[dict[str, Any] | None]) -> dict[str, Any]:
        """The sub-envs' infos batched as ``VectorEnv._add_info`` batches them one by one (each
        key an array typed by its first value, with its ``_key`` mask; dicts batched
        recursively), in one pass per key."""
        n = self.num_envs
        first_info = infos[0]
        if first_info is not None and all(
            info is not None and info.keys() == first_info.keys() for info in infos
        ):
            return self._batch_full(infos)  # type: ignore[arg-type]
        out: dict[str, Any] = {}
        keys = dict.fromkeys(key for info in infos if info is not None for key in info)
        for key in keys:
            rows = [i for i, info in enumerate(infos) if info is not None and key in info]
            present = set(rows)
            first = infos[rows[0]][key]  # type: ignore[index]
            if isinstance(first, dict):
                array: Any = self._batch_infos(
                    [infos[i][key] if i in present else None for i in range(n)]  # type: ignore[index]
                )
            else:
                array = _empty_like_info(first, n)
                for i in rows:
                    array[i] = infos[i][key]  # type: ignore[index]
            mask = np.zeros(n, dtype=np.bool_)
            mask[rows] = True
            out[key], out[f"_{key}"] = array, mask
        return out

    def _batch_full(self, infos: list[dict[str, Any]]) -> dict[str, Any]:
        """:meth:`_batch_infos` when every sub-env's info has the same keys (every step but
        those where some episodes answer or refuse): each key's values in one array, every
        mask true."""
        n = self.num_envs
        out: dict[str, Any] = {}
        full = np.ones(n, dtype=np.bool_)
        keys = list(infos[0])
        if all(list(info) == keys for info in infos):  # the usual case: one key order
            columns: Any = zip(*(info.values() for info in infos), strict=True)
        else:
            columns = ([info[key] for info in infos] for key in keys)
        for key, values in zip(keys, columns, strict=True):
            first = values[0]
            kind = type(first)
            if isinstance(first, dict):
                array: Any = self._batch_infos(list(values))
            elif kind in (int, float, bool) or isinstance(first, np.number):
                if all(type(v) is kind for v in values):
                    array = np.array(values, dtype=kind)
                else:  # cast into the first value's type, as an assignment does
                    array = _empty_like_info(first, n)
                    for i, value in enumerate(values):
                        array[i] = value
            elif isinstance(first, np.ndarray):
                array = _empty_like_info(first, n)
                for i, value in enumerate(values):
                    array[i] = value
            else:  # one object per sub-env, never unpacked as numpy would a list of lists
                array = np.fromiter(values, dtype=object, count=n)
            out[key], out[f"_{key}"] = array, full.copy()
        return out

    def render(self) -> tuple[str | None, ...]:
        return tuple(env.render() for env in self.envs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``name`` of every sub-env: called with the arguments when callable, else read."""
        out = []
        for env in self.envs:
            attr = getattr(env, name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(out)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return tuple(getattr(env, name) for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


def _empty_like_info(first: Any, n: int) -> np.ndarray:
    """The array ``VectorEnv._add_info`` makes for an info key whose first value is ``first``."""
    if type(first) in (int, float, bool) or isinstance(first, np.number):
        return np.zeros(n, dtype=type(first))
    if isinstance(first, np.ndarray):
        return np.zeros((n, *first.shape), dtype=first.dtype)
    return np.full(n, fill_value=None, dtype=object)


__all__ = ["SearchVectorEnv"]

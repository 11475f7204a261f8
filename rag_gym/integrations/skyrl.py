"""rag-gym envs through SkyRL-gym's own interface (``skyrl_gym.envs.base_text_env.BaseTextEnv``;
skyrl-gym 0.4 tested), so that SkyRL's Ray trainers step rag-gym envs inside their own workers.

:class:`RagGymSkyRLEnv` wraps any registered rag-gym id, text in and text out
(:class:`~rag_gym.wrappers.TextActions`): ``init`` resets the env and returns its chat messages
(system prompt and question); ``step(action)`` is one model turn (the raw text with its tags),
and returns the env's observation as a user message, the turn's reward, and ``done`` when the
episode ends (an answer, a refusal, the env's step limit, or ``max_turns``). Summed over an
episode, the rewards are the episode return of ``gym.make`` with the same preset.

SkyRL builds one env per trajectory, as ``skyrl_gym.make(name, env_config=..., extras=...)``:

* ``env_config`` (the trainer's ``environment.skyrl_gym.<name>`` section): ``env_id``,
  ``env_kwargs`` (``gym.make`` kwargs such as ``data_path``), ``split`` (default ``"train"``),
  ``reward_preset``, ``reward_kwargs``, ``tags``, ``max_episode_steps``, ``max_turns``;
* ``extras`` (the dataset row's): ``question_id`` (else ``index``, else a question drawn with
  ``seed``), and any of ``env_config``'s keys, which override it per row.

:func:`register` adds the class to SkyRL-gym's registry (default name ``rag_gym``);
:func:`dataset_rows` writes the rows of a split in SkyRL's dataset layout (``prompt``,
``env_class``, ``reward_spec``, ``extras``).

>>> register()
'rag_gym'
>>> import skyrl_gym
>>> env = skyrl_gym.make("rag_gym", env_config={"env_id": "rag_gym/SynthHop-v0",
...     "env_kwargs": {"dataset_kwargs": {"n_passages": 2000, "n_questions": [40, 10, 10]}}},
...     extras={"index": 0})
>>> messages, info = env.init([])
>>> [m["role"] for m in messages], info["question_id"].startswith("synthhop-")
(['system', 'user'], True)
>>> out = env.step("<search>who wrote it</search>")
>>> out["done"], out["observations"][0]["content"].startswith("<information>")
(False, True)
>>> env.step("<answer>Nobody</answer>")["done"]
True
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rag_gym.integrations._common import check_env_id, check_json_dict, json_safe
from rag_gym.wrappers.presets import make as make_with_preset
from rag_gym.wrappers.text_actions import text_actions_of

try:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "the SkyRL integration needs skyrl-gym: pip install skyrl-gym (tested with 0.4)"
    ) from exc

#: The options ``env_config`` and ``extras`` may set.
OPTIONS = (
    "env_id",
    "env_kwargs",
    "split",
    "reward_preset",
    "reward_kwargs",
    "tags",
    "max_episode_steps",
    "max_turns",
)


def _plain(value: Any) -> Any:
    """An OmegaConf ``DictConfig`` (what SkyRL passes) as plain dicts and lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return value


class RagGymSkyRLEnv(BaseTextEnv):
    """A rag-gym text env as a SkyRL-gym env (see the module doc for ``env_config`` and
    ``extras``). ``env`` is the wrapped Gymnasium env; ``info`` its last ``info``."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        config = dict(_plain(env_config) or {})
        extras = dict(_plain(extras) or {})
        unknown = sorted(set(config) - set(OPTIONS))
        if unknown:
            raise ValueError(
                f"unknown rag-gym SkyRL env options {unknown}; expected some of {list(OPTIONS)}"
            )
        options = {**config, **{k: v for k, v in extras.items() if k in OPTIONS}}
        if "env_id" not in options:
            raise ValueError(
                "expected env_id (a registered rag-gym id, e.g. rag_gym/HotpotQA-v0) in the "
                "env config or the row's extras"
            )
        self.env_id = check_env_id(options["env_id"])
        env_kwargs = check_json_dict("env_kwargs", options.get("env_kwargs"))
        env_kwargs.setdefault("split", options.get("split", "train"))
        self.env: gym.Env = make_with_preset(
            self.env_id,
            options.get("reward_preset") or "none",
            reward_kwargs=check_json_dict("reward_kwargs", options.get("reward_kwargs")),
            max_episode_steps=options.get("max_episode_steps"),
            text_actions=options.get("tags") or True,
            **env_kwargs,
        )
        self.max_turns = int(options.get("max_turns", 8))
        self.reset_options = {
            option: extras[key]
            for key, option in (("question_id", "question_id"), ("index", "question_index"))
            if extras.get(key) is not None
        }
        self.seed = extras.get("seed")
        self.info: dict[str, Any] = {}
        self.episode_return = 0.0

    def init(self, prompt: Any = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Reset the env: its chat messages (system prompt, instructions and question) and
        ``{"question_id"}``. SkyRL's own ``prompt`` is not used: the env writes the prompt."""
        self.turns = 0
        self.episode_return = 0.0
        _, info = self.env.reset(seed=self.seed, options=self.reset_options or None)
        self.info = info
        messages = text_actions_of(self.env).messages()
        return messages, {"question_id": info.get("question_id")}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One model turn: ``action`` is its raw text."""
        self.turns += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.info = info
        self.episode_return += float(reward)
        done = bool(terminated or truncated or self.turns >= self.max_turns)
        metadata = json_safe(
            {
                k: info.get(k)
                for k in ("format_ok", "actions", "queries", "prediction", "question_id")
                if k in info
            }
        )
        return BaseTextEnvStepOutput(
            observations=[] if done or not obs else [{"role": "user", "content": obs}],
            reward=float(reward),
            done=done,
            metadata=metadata,
            postprocessed_action=None,
        )

    def get_metrics(self) -> dict[str, Any]:
        """The episode's figures: its return, turns and searches, and the EM and F1 of its
        answer (0 without one)."""
        from rag_gym.metrics import exact_match, f1_score

        prediction = self.info.get("prediction")
        golds = self.env.unwrapped.current_example.answers
        answered = isinstance(prediction, str)
        return {
            "episode_return": self.episode_return,
            "turns": self.turns,
            "searches": int(self.info.get("num_searches") or 0),
            "em": exact_match(prediction, golds) if answered else 0.0,
            "f1": f1_score(prediction, golds) if answered else 0.0,
        }

    def close(self) -> None:
        self.env.close()


def register(name: str = "rag_gym") -> str:
    """Register :class:`RagGymSkyRLEnv` in SkyRL-gym's registry as ``name`` (once); returns it."""
    import skyrl_gym
    from skyrl_gym.envs.registration import registry

    if name not in registry:
        skyrl_gym.register(id=name, entry_point="rag_gym.integrations.skyrl:RagGymSkyRLEnv")
    return name


def dataset_rows(
    env_id: str, split: str = "train", env_class: str = "rag_gym", **env_kwargs: Any
) -> list[dict[str, Any]]:
    """One SkyRL dataset row per question of ``split``: ``prompt`` (the env's first messages),
    ``env_class``, ``reward_spec`` (the gold answers) and ``extras`` (``question_id`` and
    ``env_id``)."""
    env = RagGymSkyRLEnv({"env_id": env_id, "split": split, "env_kwargs": env_kwargs})
    rows = []
    for example in env.env.unwrapped.examples:
        env.reset_options = {"question_id": example.id}
        messages, _ = env.init()
        rows.append(
            {
                "prompt": messages,
                "env_class": env_class,
                "reward_spec": {
                    "method": "rule",
                    "ground_truth": {"target": list(example.answers)},
                },
                "extras": {"question_id": example.id, "env_id": env_id},
            }
        )
    return rows

"""Reward presets: each paper's reward stack, by name. Each paper's module in
:mod:`rag_gym.wrappers` (``evo_rag``, ``eval_rar``, ``arena``, ``r2ag``, ``when_to_search``)
registers its preset beside its reward terms: the stack, the env it needs, its options, its tag
set, its agent and its training recipe.

``apply(env, name)`` wraps an env made with ``gym.make``; :func:`make` (``rag_gym.make``, where
every env stack is assembled) does both. The stack goes outside the env's one ``TimeLimit`` (the
registered horizon, the papers' T_max = 20 steps and 5 tree expansions, or ``max_episode_steps``),
so the reward terms see truncation, read their T_max from ``env.spec.max_episode_steps``, and
are listed in ``env.spec.additional_wrappers``: ``gym.make(env.spec)`` builds it again.

| preset | env kind | total reward |
|---|---|---|
| ``evo_rag`` | search | EVO-RAG's ``R_t = Σ_k w_k(t) r_k``, time-dynamic Table 1 weights (§3.2, §3.5–3.6) |
| ``evo_rag_two_stage`` | search | the same seven terms with constant weights per stage (Table 4 "Two-stage") |
| ``arena`` | reader | format + accuracy + relevance + 10·bonus (ARENA §3.3) |
| ``r2ag`` | tree | ``0.2 R_MH + 0.3 R_JH + 0.2 R_AP + R_f``, gated (R²AG eq. 5, appendix B.2) |
| ``eval_rar`` | search | ``R_ans`` (EM) if > 0 else ``R_eval`` (Eval-RAR eq. 5) |
| ``when_to_search`` | search (text) | ``r_a + r_s + r_f`` at the episode's end (LWTS eq. 12); wraps ``TextActions`` |
| ``none`` | any | the env's own reward |

Every preset but ``none`` starts with :class:`~rag_gym.wrappers.DropBaseReward`, so the total is
exactly the paper's formula. Options go through ``**kwargs``: ``stage`` (EVO-RAG
``"discovery"``/``"refinement"``; LWTS 1/2), ``encoder`` (for the embedding terms), ``verifier``
(EVO-RAG's refusal), ``correctness`` (LWTS), ``normalization`` (LWTS avg_sim).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from rag_gym._registry import Registry, caller_origin
from rag_gym.envs.reader import ReaderEnv
from rag_gym.envs.search import SearchEnv
from rag_gym.envs.tags import TagSet, tag_set
from rag_gym.envs.tree import TreeSearchEnv
from rag_gym.wrappers.base import DropBaseReward, DuplicateRewardTerm
from rag_gym.wrappers.text_actions import TextActions, text_actions_of


@dataclass(frozen=True)
class RewardPreset:
    """A paper's reward stack, and what goes with it: the env it needs, its options, the tags a
    text policy writes under it, and its baseline agent."""

    build: Callable[..., gym.Env]
    """``build(env, *, t_max, **options) -> gym.Env``: the reward wrappers around ``env``
    (already in :class:`~rag_gym.wrappers.DropBaseReward`, so the total is the paper's formula);
    ``t_max`` is the horizon (``None``: the env's ``spec.max_episode_steps``)."""
    env_class: type = SearchEnv
    """The env class it needs (``SearchEnv``, ``TreeSearchEnv``, ``ReaderEnv``, or a subclass)."""
    options: frozenset[str] = frozenset()
    """The options ``reward_kwargs`` may give ``build``; any other is refused by name."""
    tags: str | None = None
    """The tag set (:func:`~rag_gym.envs.tags.tag_set`) a text policy writes under this
    reward; ``None``: ``search_r1``'s."""
    agent: str | None = None
    """Its paper's agent (a name ``rag-gym evaluate --agents`` takes)."""
    description: str = ""
    recipe: dict[str, Any] | None = None
    """Its paper's training recipe: :class:`~rag_gym.train.grpo.EnvGRPOConfig` settings
    (:func:`rag_gym.train.recipes.recipe` takes the preset's name or its agent's)."""
    text_in: bool = False
    """Whether its terms read the model's text (LWTS): ``build`` gets the env in ``TextActions``."""

    def __post_init__(self) -> None:
        if not callable(self.build):
            raise TypeError(f"expected build to be callable, got {type(self.build).__name__}")
        if not (isinstance(self.env_class, type) and issubclass(self.env_class, gym.Env)):
            raise TypeError(f"expected env_class to be a gym.Env subclass, got {self.env_class!r}")
        object.__setattr__(self, "options", frozenset(self.options))


def _as_preset(name: str, value: Any) -> RewardPreset:
    if isinstance(value, RewardPreset):
        return value
    if callable(value):
        return RewardPreset(build=value)
    raise TypeError(f"expected a RewardPreset or its build function, got {type(value).__name__}")


PRESETS: Registry[RewardPreset] = Registry("reward preset", "rag_gym.presets", _as_preset)
"""Every reward preset by name (a :class:`~rag_gym._registry.Registry`); ``none`` is the env's
own reward."""


def register_preset(
    name: str, preset: RewardPreset | Callable[..., gym.Env], *, replace: bool = False
) -> RewardPreset:
    """Register a reward preset as ``name`` (a :class:`RewardPreset`, or its build function for
    a search env without options): ``rag_gym.make(id, reward_preset=name)``, the trainers'
    ``reward_preset`` and the integrations then take it. An installed package registers one
    through an entry point in the group ``rag_gym.presets``."""
    if isinstance(preset, RewardPreset) and preset.tags is not None:
        from rag_gym.envs.tags import TAG_PRESETS

        TAG_PRESETS.key(preset.tags)  # a typed error naming the tag sets, before any trainer
    return PRESETS.register(name, preset, replace=replace, origin=caller_origin())


def check_preset(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"expected a reward preset name (str), got {type(name).__name__}")
    return PRESETS.key(name)


def _id_suffix(kind: type) -> str:
    return (
        "-Reader"
        if issubclass(kind, ReaderEnv)
        else "-Tree"
        if issubclass(kind, TreeSearchEnv)
        else ""
    )


def apply(env: gym.Env, name: str, t_max: int | None = None, **kwargs: Any) -> gym.Env:
    """Wrap ``env`` in the reward stack of preset ``name`` (see the module table).

    ``t_max`` (the horizon of EVO-RAG's time-dependent terms) defaults to the env's
    ``spec.max_episode_steps``, the ``TimeLimit`` inside the stack."""
    name = check_preset(name)
    if name == "none":
        if kwargs:
            raise TypeError(f"reward preset 'none' takes no options, got {sorted(kwargs)}")
        return env
    preset = PRESETS.get(name)
    kind = preset.env_class
    if not isinstance(env.unwrapped, kind):
        raise ValueError(
            f"reward preset {name!r} needs a {kind.__name__}, got {type(env.unwrapped).__name__}; "
            f"use a {_id_suffix(kind)}-v0 id"
        )
    unknown = set(kwargs) - preset.options
    if unknown:
        raise TypeError(
            f"reward preset {name!r} got unknown options {sorted(unknown)}; it takes "
            f"{sorted(preset.options)}"
        )
    env = DropBaseReward(env)
    if preset.text_in:
        env = TextActions(env, tags=default_tags(name))
    return preset.build(env, t_max=t_max, **kwargs)


def default_tags(reward_preset: str) -> str:
    """The tag set a text policy writes under a reward preset: the preset's ``tags``, else
    ``search_r1``."""
    return PRESETS.get(reward_preset).tags or "search_r1"


def _none(env: gym.Env, *, t_max: int | None = None) -> gym.Env:
    return env


PRESETS.register(
    "none", RewardPreset(_none, gym.Env, description="the env's own reward"), origin="rag-gym"
)


def make(
    env_id: str | gym.envs.registration.EnvSpec,
    reward_preset: str = "none",
    reward_kwargs: dict[str, Any] | None = None,
    max_episode_steps: int | None = None,
    text_actions: bool | str | TagSet | None = None,
    extra_terms: Sequence[Callable[[gym.Env], gym.Env]] = (),
    **kwargs: Any,
) -> gym.Env:
    """The env stack, inside out: ``gym.make(env_id, max_episode_steps=..., **kwargs)``,
    ``reward_preset``'s wrappers (options: ``reward_kwargs``), each of ``extra_terms`` (callables
    ``env -> env``: a wrapper class, or ``functools.partial(StepCost, weight=0.05)``), then
    :func:`with_text_actions` with tag set ``text_actions`` (``True``: :func:`default_tags`, or
    none for a tree or reader env, which takes text; ``None``: none but a text-in preset's own).

    >>> import functools, rag_gym
    >>> from rag_gym.wrappers import StepCost
    >>> env = rag_gym.make("rag_gym/SynthHop-v0", reward_preset="eval_rar", max_episode_steps=7,
    ...                    text_actions=True, extra_terms=[functools.partial(StepCost, weight=0.05)],
    ...                    dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
    >>> env.spec.max_episode_steps, [w.name for w in env.spec.additional_wrappers]
    (7, ['DropBaseReward', 'AnswerCorrectnessReward', 'EvaluationReward', 'StepCost', 'TextActions'])
    """
    check_preset(reward_preset)
    if reward_kwargs is not None and not isinstance(reward_kwargs, dict):
        raise TypeError(f"expected reward_kwargs to be a dict, got {type(reward_kwargs).__name__}")
    if reward_kwargs and reward_preset == "none":
        raise TypeError("reward_kwargs needs a reward_preset; pass reward_preset='<name>'")
    if not (text_actions is None or isinstance(text_actions, bool)):
        tag_set(text_actions)  # a wrong type's or an unknown name's error before the env is built
    extra_terms = tuple(extra_terms)
    if not all(callable(term) for term in extra_terms):
        raise TypeError(f"expected extra_terms to be callables env -> env, got {extra_terms!r}")
    env = gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)
    env = apply(env, reward_preset, **(reward_kwargs or {}))
    for term in extra_terms:
        try:
            env = term(env)
        except DuplicateRewardTerm as exc:
            raise DuplicateRewardTerm(
                f"{exc}: it is the {reward_preset!r} preset's or an earlier extra term's; use "
                "reward_preset='none' with extra terms"
            ) from None
    if text_actions is True:  # a tree or reader env takes text as it is
        text_actions = isinstance(env.unwrapped, SearchEnv) and default_tags(reward_preset)
    return with_text_actions(env, text_actions) if text_actions else env


def with_text_actions(env: gym.Env, tags: str | TagSet) -> gym.Env:
    """``env`` as a text policy that writes tag set ``tags`` plays it: in
    :class:`~rag_gym.wrappers.TextActions`, unless its chain has one already (a text-in
    preset's), which must parse ``tags``; a tree or reader env takes text as it is, with no tags."""
    found = text_actions_of(env)
    if found is None and isinstance(env.unwrapped, SearchEnv):
        return TextActions(env, tags=tags)
    own, name = found.tags.name if found is not None else None, tag_set(tags).name
    if own != name:
        raise ValueError(
            f"expected tags {own!r}, what this {type(env.unwrapped).__name__} reads as built (a "
            f"text-in reward preset's TextActions, or text as it is: None), got {name!r}"
        )
    return env


def set_stage(env: gym.Env, stage: str | int) -> None:
    """Switch the curriculum stage of every staged reward in ``env``'s wrapper chain (each
    wrapper whose class has a ``set_stage`` method: EVO-RAG's
    :class:`~rag_gym.wrappers.TimeDynamicWeights`: ``"discovery"`` / ``"refinement"``; LWTS's
    :class:`~rag_gym.wrappers.MultiStageAnswerReward`: 1 / 2) — the
    hook a trainer callback calls. Takes effect from the next step. For a vector env, call
    ``envs.call("set_stage", stage)``: the wrappers' own ``set_stage`` is found through each
    sub-env's chain.
    """
    found = False
    while isinstance(env, gym.Wrapper):
        if callable(getattr(type(env), "set_stage", None)):
            env.set_stage(stage)
            found = True
        env = env.env
    if not found:
        raise ValueError(
            "no staged reward in this env: use the evo_rag, evo_rag_two_stage or when_to_search "
            "preset (or a reward wrapper of your own with a set_stage method)"
        )

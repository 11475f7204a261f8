"""Sibling branches of EVO-RAG (§3.3, Algorithm 1 line 10): roll-outs, replaying an episode's
actions to restore a visited state, and completing each sibling action with the policy."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rag_gym.train.evo_rag_dpo.config import SIBLING_ACTIONS
from rag_gym.train.rollout import Episode, RolloutEngine


@dataclass
class ReplayStep:
    """One replayed env step of an episode."""

    action_text: str
    """The text the env received."""
    action_type: str
    """The action executed (``SEARCH`` … ``REFUSE``), or ``INVALID`` when no action tag parsed."""
    reward: float
    reward_terms: dict[str, float]
    observation: str
    """What the model read next."""
    mask_before: list[int]
    """The env's ``action_mask`` at the state before the step."""


@dataclass
class Replay:
    """An episode's action texts replayed from a reset on its question."""

    question: str
    steps: list[ReplayStep]
    info: dict[str, Any]
    """The last step's ``info`` (the reset's when no step was replayed)."""

    @property
    def episode_return(self) -> float:
        return float(sum(s.reward for s in self.steps))


def replay(env: Any, index: int, actions: Sequence[str]) -> Replay:
    """Restore a state: reset ``env`` on question ``index`` and step ``actions`` (the action texts
    played before it). EVO-RAG's envs are deterministic given the question and the texts."""
    from rag_gym.envs.search import ActionType

    _, info = env.reset(options={"question_index": int(index)})
    question = info["question"]
    steps = []
    for n, text in enumerate(actions):
        mask = [int(v) for v in info.get("action_mask", [1] * len(ActionType))]
        obs, reward, terminated, truncated, info = env.step(text)
        if (terminated or truncated) and n < len(actions) - 1:
            raise ValueError(
                f"replaying question {index}: action {n} of {len(actions)} ends the episode"
            )
        executed = info.get("actions") or ["INVALID"]
        steps.append(
            ReplayStep(
                action_text=text,
                action_type=executed[0],
                reward=float(reward),
                reward_terms={k: float(v) for k, v in info.get("reward_terms", {}).items()},
                observation=obs,
                mask_before=mask,
            )
        )
    return Replay(question=question, steps=steps, info=info)


def branch_text(
    question: str, history: Sequence[ReplayStep], t: int, t_max: int, action: str
) -> str:
    """What the preference model embeds for a branch: the trajectory prefix ending in its action
    (§3.3). The action, the step and the question come first and the earlier steps follow, most
    recent first, each observation clipped to 300 characters, so the encoder's input limit
    (256 word pieces for MiniLM) cuts the oldest evidence, never the action."""
    lines = [f"Step {t + 1}/{t_max} action: {action.strip()}", f"Question: {question}"]
    for j in range(len(history) - 1, -1, -1):
        step = history[j]
        obs = " ".join(step.observation.split())[:300]
        lines.append(f"Step {j + 1}: {step.action_text.strip()} -> {obs}")
    return "\n".join(lines)


@dataclass
class Sibling:
    """One branch at a visited state: its first action and its completed trajectory."""

    action_type: str
    """``SEARCH``, ``BACKTRACK``, ``ANSWER``, ``REFUSE``, or ``INVALID`` (a policy action that
    parsed to none)."""
    action_ids: list[int]
    """The action's tokens (a policy pair's chosen or rejected completion)."""
    action_text: str
    episode_return: float
    """R(x): the time-weighted return of the whole trajectory (shared prefix + branch)."""
    reward_terms: dict[str, float]
    """Each term's weighted sum over the trajectory."""
    taken: bool = False
    """The rollout's own action (its branch is the rollout's continuation)."""
    finished: bool = False
    em: float = 0.0
    text: str = ""
    """What the preference model embeds (:func:`branch_text`)."""


@dataclass
class VisitedState:
    """A state ``s_t`` of a rolled-out episode and its sibling branches."""

    index: int
    """The question's index in the split."""
    t: int
    """Steps before the state."""
    prompt_ids: list[int]
    """Every token the policy read before acting at ``s_t``: the prompt, its earlier actions and
    the env's replies, exactly as in the rollout."""
    siblings: list[Sibling]


@dataclass
class BranchJob:
    """A branch to play: at state ``t`` of ``episode``, write ``prefix_ids`` and, when ``close``
    is set, let the policy finish the action up to that closing tag; then complete the episode."""

    episode: Episode
    t: int
    action_type: str
    prefix_ids: list[int]
    close: str | None = None


def env_copies(engine: RolloutEngine, n: int, stage: str | None = None) -> list[Any]:
    """The first ``n`` env copies of ``engine`` (made as needed), each scoring with the
    curriculum ``stage`` (§3.5) when given."""
    from rag_gym.rewards.core import evo_rag_weights
    from rag_gym.wrappers import presets

    if stage is not None:
        evo_rag_weights(0.0, stage, "dynamic")  # validates the name
    engine.grow(n)
    if stage is not None:
        for env in engine.envs:
            presets.set_stage(env, stage)
    return engine.envs[:n]


class SiblingBrancher:
    """Rolls out episodes and branches sibling actions at their visited states (§3.3).

    Args:
        engine: a :class:`~rag_gym.train.rollout.RolloutEngine` over the ``evo_rag`` env
            (its env copies are reused for branches).
        sibling_actions: the action types tried at each state besides the policy's own.
        max_branch_states: states branched per episode (random), ``None`` for all.
        batch_size: episodes played at once.
        seed: draws the branched states.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        sibling_actions: Sequence[str] = SIBLING_ACTIONS,
        max_branch_states: int | None = None,
        batch_size: int = 32,
        seed: int = 0,
    ) -> None:
        from rag_gym.wrappers.evo_rag import TimeDynamicWeights, find_wrapper
        from rag_gym.wrappers.text_actions import TextActions

        self.engine = engine
        self.tokenizer = engine.tokenizer
        env = engine.envs[0]
        text = find_wrapper(env, TextActions)
        weights = find_wrapper(env, TimeDynamicWeights)
        if text is None or weights is None:
            raise ValueError(
                "EVO-RAG branching needs a TextActions env with the evo_rag reward preset; build "
                "it with env_factory(env_id, reward_preset='evo_rag', tags='evo_rag')"
            )
        self.t_max = weights.t_max
        tags = text.tags
        self._actions: dict[str, tuple[str, str | None]] = {}
        for name, tag, closing in (
            ("SEARCH", tags.search, True),
            ("ANSWER", tags.answer, True),
            ("BACKTRACK", tags.backtrack, False),
            ("REFUSE", tags.refuse, False),
        ):
            if tag:
                self._actions[name] = (f"<{tag}>", f"</{tag}>") if closing else (f"<{tag}/>", None)
        missing = [a for a in sibling_actions if a not in self._actions]
        if missing:
            raise ValueError(
                f"the env's tag set {tags.name!r} has no tag for the sibling actions {missing}; "
                "use tags='evo_rag'"
            )
        self.sibling_actions = tuple(sibling_actions)
        self.max_branch_states = max_branch_states
        self.batch_size = batch_size
        self.rng = random.Random(seed)
        self.stage: str | None = None

    # ---- envs ---------------------------------------------------------------------------------
    def set_stage(self, stage: str) -> None:
        """The curriculum stage every env copy scores with (§3.5)."""
        self.stage = stage
        env_copies(self.engine, len(self.engine.envs), stage)

    def _envs(self, n: int) -> list[Any]:
        return env_copies(self.engine, n, self.stage)

    # ---- roll-outs ----------------------------------------------------------------------------
    def rollout(self, generate: Callable, indices: Sequence[int]) -> list[Episode]:
        """One episode per question index with the policy (§3.4 (i))."""
        episodes: list[Episode] = []
        for start in range(0, len(indices), self.batch_size):
            chunk = list(indices[start : start + self.batch_size])
            self._envs(len(chunk))
            episodes += self.engine.play(generate, chunk)
        return episodes

    def replay_episode(self, episode: Episode, t: int | None = None) -> Replay:
        """Replay ``episode``'s first ``t`` actions (all by default) in env copy 0; the full
        replay must give the episode's return."""
        spans = episode.turn_spans
        if len(spans) != episode.turns:
            raise ValueError(
                f"expected one model-written run per turn, got {len(spans)} recorded spans for "
                f"{episode.turns} turns: replay an Episode that RolloutEngine played"
            )
        texts = [self._decode(episode.completion_ids[a:b]) for a, b in spans]
        env = self._envs(1)[0]
        result = replay(env, episode.index, texts if t is None else texts[:t])
        if t is None and abs(result.episode_return - episode.episode_return) > 1e-6:
            raise RuntimeError(
                f"replaying question {episode.index} gave return {result.episode_return:.6f}, "
                f"the rollout {episode.episode_return:.6f}: the env is not deterministic given "
                "the question and the action texts, so its states cannot be restored"
            )
        return result

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ---- branches -----------------------------------------------------------------------------
    def branch(self, generate: Callable, episodes: Sequence[Episode]) -> list[VisitedState]:
        """Every (or ``max_branch_states``) visited state of each episode with its siblings:
        the rollout's own action and one branch per other action type, each completed by
        ``generate`` (Algorithm 1 line 10)."""
        states: list[VisitedState] = []
        jobs: list[BranchJob] = []
        owners: list[tuple[int, str, list[ReplayStep]]] = []
        for ep in episodes:
            full = self.replay_episode(ep)
            spans = ep.turn_spans
            chosen = list(range(len(spans)))
            if self.max_branch_states is not None and len(chosen) > self.max_branch_states:
                chosen = sorted(self.rng.sample(chosen, self.max_branch_states))
            for t in chosen:
                step = full.steps[t]
                start, end = spans[t]
                taken = Sibling(
                    action_type=step.action_type,
                    action_ids=list(ep.completion_ids[start:end]),
                    action_text=step.action_text,
                    episode_return=ep.episode_return,
                    reward_terms=dict(ep.reward_terms),
                    taken=True,
                    finished=ep.finished,
                    em=ep.em,
                    text=branch_text(
                        full.question, full.steps[:t], t, self.t_max, step.action_text
                    ),
                )
                state = VisitedState(
                    index=ep.index,
                    t=t,
                    prompt_ids=list(ep.prompt_ids) + list(ep.completion_ids[:start]),
                    siblings=[taken],
                )
                states.append(state)
                for action in self.sibling_actions:
                    if action == step.action_type:
                        continue
                    if action == "BACKTRACK" and not step.mask_before[2]:
                        continue  # nothing to drop yet: the env would call it invalid
                    opening, close = self._actions[action]
                    jobs.append(
                        BranchJob(
                            ep,
                            t,
                            action,
                            self.tokenizer.encode(opening, add_special_tokens=False),
                            close,
                        )
                    )
                    owners.append((len(states) - 1, full.question, full.steps[:t]))
        siblings = self.play_branches(generate, jobs)
        for (owner, question, history), job, sibling in zip(owners, jobs, siblings, strict=True):
            sibling.text = branch_text(question, history, job.t, self.t_max, sibling.action_text)
            states[owner].siblings.append(sibling)
        return states

    def play_branches(self, generate: Callable, jobs: Sequence[BranchJob]) -> list[Sibling]:
        """Play each job: restore its state, write its action, complete the episode with
        ``generate``; in batches of ``batch_size``."""
        out: list[Sibling] = []
        for start in range(0, len(jobs), self.batch_size):
            out += self._play_chunk(generate, list(jobs[start : start + self.batch_size]))
        return out

    def _play_chunk(self, generate: Callable, jobs: list[BranchJob]) -> list[Sibling]:
        engine = self.engine
        envs = self._envs(len(jobs))
        branches: list[Episode] = []
        for job, env in zip(jobs, envs, strict=True):
            spans = job.episode.turn_spans
            start = spans[job.t][0]
            prefix = [self._decode(job.episode.completion_ids[a:b]) for a, b in spans[: job.t]]
            restored = replay(env, job.episode.index, prefix)
            terms = dict.fromkeys(job.episode.reward_terms, 0.0)
            for step in restored.steps:
                for key, value in step.reward_terms.items():
                    terms[key] = terms.get(key, 0.0) + value
            branches.append(
                Episode(
                    prompt_ids=list(job.episode.prompt_ids),
                    completion_ids=list(job.episode.completion_ids[:start]),
                    env_mask=list(job.episode.env_mask[:start]),
                    episode_return=restored.episode_return,
                    reward_terms=terms,
                    turns=job.t,
                    index=job.episode.index,
                    turn_rewards=list(job.episode.turn_rewards[: job.t]),
                    turn_spans=list(job.episode.turn_spans[: job.t]),
                    anchors=list(job.episode.anchors[: job.t]),
                    observations=list(job.episode.observations[: job.t + 1]),
                )
            )
        actions = self._write_actions(generate, jobs, branches)
        active = []
        for i, (branch, env, action) in enumerate(zip(branches, envs, actions, strict=True)):
            # RolloutEngine's own turn step, so a branch has exactly the rollout's token layout
            if engine.advance(branch, env, action):
                active.append(i)
        while active:
            budgets = [
                engine.max_completion_tokens - len(branches[i].completion_ids) for i in active
            ]
            new = generate(
                [branches[i].prompt_ids + branches[i].completion_ids for i in active],
                max(1, min(engine.max_turn_tokens, min(budgets))),
                engine.stop,
            )
            active = [
                i
                for i, tokens in zip(active, new, strict=True)
                if engine.advance(branches[i], envs[i], list(tokens))
            ]
        return [
            Sibling(
                action_type=job.action_type,
                action_ids=action,
                action_text=self._decode(action),
                episode_return=branch.episode_return,
                reward_terms=dict(branch.reward_terms),
                finished=branch.finished,
                em=branch.em,
            )
            for job, branch, action in zip(jobs, branches, actions, strict=True)
        ]

    def _write_actions(
        self, generate: Callable, jobs: list[BranchJob], branches: list[Episode]
    ) -> list[list[int]]:
        """Each job's action tokens: the prefix, plus the policy's text up to the closing tag
        (appended when the policy did not write it) for SEARCH and ANSWER siblings."""
        actions = [list(job.prefix_ids) for job in jobs]
        eos = self.tokenizer.eos_token_id
        for close in sorted({job.close for job in jobs if job.close}):
            rows = [i for i, job in enumerate(jobs) if job.close == close]
            new = generate(
                [branches[i].prompt_ids + branches[i].completion_ids + actions[i] for i in rows],
                max(1, self.engine.max_turn_tokens - 2),
                [close],
            )
            for i, tokens in zip(rows, new, strict=True):
                tokens = list(tokens)
                while tokens and tokens[-1] == eos:
                    tokens.pop()
                actions[i] += tokens
                if close not in self._decode(actions[i]):
                    actions[i] += self.tokenizer.encode(close, add_special_tokens=False)
        return actions

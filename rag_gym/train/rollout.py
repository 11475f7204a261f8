"""Multi-turn episodes in a text-action env, as token sequences an RL trainer can learn from.

An episode is one prompt (the chat template of the env's first messages, with the generation
prompt) and one *completion* that interleaves model-written and env-written tokens, the
Search-R1 / Eval-RAR layout::

    <think>…</think><search>q1</search>          ← model (env_mask 1)
    \\n<information>Doc 1(Title: …) …</information>\\n   ← env (env_mask 0)
    <search>q2</search>                          ← model
    …
    <answer>Paris</answer>                       ← model
    <|im_end|>                                   ← env: the episode ended (env_mask 0)

Each turn the model generates until an action tag closes (a stop string such as
``</search>``), an end-of-sequence token, or ``max_turn_tokens``; the text is the env's action;
the observation is tokenised and appended. Only ``env_mask == 1`` tokens are trained (TRL's
``env_mask`` field of a rollout function). An episode that runs out of
``max_completion_tokens`` stops unfinished and gets no end token, so a trainer sees it as
truncated (DAPO's overlong masking drops it from the loss).

The token sequences are continued by a :data:`Generate` function: a :class:`Sampler` on a
language model's :meth:`~rag_gym.generation.lm.LanguageModel.generate_ids` (the policy being
trained on transformers: :func:`make_generator`; TRL's colocated vLLM engine:
:class:`~rag_gym.generation.vllm_lm.VLLMLM`), or a scripted policy in tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym

from rag_gym import traces
from rag_gym.generation.lm import GenerationConfig, LanguageModel
from rag_gym.train.credit import anchor
from rag_gym.wrappers.text_actions import OBS_TEMPLATE

__all__ = [
    "Episode",
    "Generate",
    "RolloutEngine",
    "Sampler",
    "action_stops",
    "eval_mode",
    "first_messages",
    "make_generator",
    "merged_lora",
]

Generate = Callable[[list[list[int]], int, Sequence[str]], list[list[int]]]
"""``generate(sequences, max_new_tokens, stop)``: continue each token sequence by at most
``max_new_tokens`` tokens, a row stopping early at any of ``stop`` (kept) or at the
end-of-sequence token (kept); returns the new tokens. Optional attributes: ``session()`` (a
context kept for one :meth:`RolloutEngine.play`), and ``run_clients(clients)`` with
``concurrent_clients`` true (each episode a client of one running batch)."""


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode inside the block (no dropout while sampling from a policy in
    training), and back in the mode it was in afterwards."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


@contextlib.contextmanager
def merged_lora(model: Any) -> Iterator[None]:
    """``model``'s LoRA adapters merged into their base weights inside the block.

    A LoRA layer otherwise runs three matrix products per linear layer (base, A, B): with
    SmolLM2 on CPU a decoding step takes about 1.5 times as long. The base weights are copied
    first and copied back afterwards, so they come out bit for bit as they were (PEFT's own
    unmerge subtracts the update again, which drifts by a rounding error each time). The copy
    costs the adapted layers' weights once more in memory; for large models on a GPU, generate
    with vLLM instead. No-op for a model without LoRA layers, or inside another such block
    (its layers are merged already).
    """
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        LoraLayer = None
    layers = (
        [m for m in model.modules() if isinstance(m, LoraLayer) and not m.merged]
        if LoraLayer is not None
        else []
    )
    if not layers:
        yield
        return
    import torch

    weights = [m.get_base_layer().weight for m in layers]
    saved = [w.detach().clone() for w in weights]
    try:
        with torch.no_grad():
            for m in layers:
                m.merge()
        yield
    finally:
        with torch.no_grad():
            for m in layers:
                if m.merged:
                    m.unmerge()
            for w, copy in zip(weights, saved, strict=True):
                w.copy_(copy)


class Sampler:
    """A :data:`Generate` that samples from ``lm`` (:meth:`LanguageModel.generate_ids
    <rag_gym.generation.lm.LanguageModel.generate_ids>`) at ``temperature`` (0: greedy) and
    ``top_p``, each call seeded from torch's global generator, so runs under a fixed seed
    repeat. A torch policy (``lm.model``, possibly PEFT-wrapped and in training) samples in
    eval mode with its LoRA adapters merged (:func:`merged_lora`).

    On transformers' continuous-batching engine, :meth:`session` keeps each episode's keys
    and values across its turns, so turn ``t + 1`` computes only the observation and the new
    reply (re-computing the whole episode every turn makes a multi-turn step cost about twice
    a single-turn one), and :meth:`run_clients` plays each episode as a client of one running
    batch (:attr:`concurrent_clients`). Elsewhere every turn of every active episode is one
    call.
    """

    def __init__(self, lm: LanguageModel, temperature: float = 1.0, top_p: float = 1.0) -> None:
        self.lm = lm
        self.model = getattr(lm, "model", None)
        self.sampling = GenerationConfig(temperature=temperature, top_p=top_p)
        self.concurrent_clients = bool(getattr(lm, "engine_enabled", False))
        """Whether :meth:`run_clients` batches the episodes' calls (transformers' engine)."""
        self._prepared = False

    @contextlib.contextmanager
    def _policy(self) -> Iterator[None]:
        """The policy in eval mode with merged LoRA weights (once: a call inside
        :meth:`session` or :meth:`run_clients` leaves it as it is)."""
        if self.model is None or self._prepared:
            yield
            return
        self._prepared = True
        try:
            with eval_mode(self.model), merged_lora(self.model):
                yield
        finally:
            self._prepared = False

    @contextlib.contextmanager
    def session(self) -> Iterator[Sampler]:
        """One rollout: the language model's :meth:`~rag_gym.generation.lm.LanguageModel.session`
        on the policy as it samples."""
        with self._policy(), self.lm.session():
            yield self

    def run_clients(self, clients: Sequence[Callable[[], None]]) -> None:
        """Run ``clients`` (each plays one episode, calling this generator once per turn) as
        one continuously batched generation (:meth:`LanguageModel.run_clients
        <rag_gym.generation.lm.LanguageModel.run_clients>`)."""
        with self._policy():
            self.lm.run_clients(clients)

    def __call__(
        self, sequences: list[list[int]], max_new_tokens: int, stop: Sequence[str]
    ) -> list[list[int]]:
        import torch

        config = replace(
            self.sampling,
            max_tokens=max_new_tokens,
            stop=tuple(stop),
            seed=int(torch.randint(0, 2**62, ()).item()),
        )
        with self._policy():
            return [tokens for tokens, _ in self.lm.generate_ids(sequences, config)]


def make_generator(
    model: Any, tokenizer: Any, temperature: float = 1.0, top_p: float = 1.0, batch_size: int = 16
) -> Sampler:
    """The rollouts' :class:`Sampler` on ``model``, the policy being trained, through
    :class:`~rag_gym.generation.transformers_lm.TransformersLM` (``batch_size``: rows decoded
    together, and episodes whose caches are kept). A model its engine cannot run generates on
    ``model.generate``: the engine warns, and ``generator.lm.describe()`` (what runs record)
    keeps the reason."""
    from rag_gym.generation.transformers_lm import TransformersLM

    lm = TransformersLM.from_model(model, tokenizer, batch_size=batch_size)
    return Sampler(lm, temperature, top_p)


@dataclass
class Episode:
    """One played episode.

    Attributes:
        prompt_ids: the rendered first messages, ending with the generation prompt.
        completion_ids: model and env tokens after the prompt.
        env_mask: 1 for each model-written token, 0 for each env-written one.
        text: the completion decoded (special tokens dropped).
        episode_return: the sum of the env's rewards.
        reward_terms: each ``info["reward_terms"]`` key summed over the episode.
        turns: model turns played.
        num_searches: valid SEARCH actions (from ``info``).
        finished: the env ended the episode (terminated or truncated by its own limit).
        cut: the token budget or ``max_turns`` stopped it first.
        info: the last step's ``info`` (minus bulky keys).
        index: the question's index in the env's split.
        trace: the question (``question_id``, ``question``, ``answers``, ``gold_ids``), its
            ``steps`` and the ``passages`` they touched, in the schema of :mod:`rag_gym.traces`.
        turn_rewards: the env's reward for each model turn (the step it took).
        turn_spans: each model turn's tokens, ``[start, end)`` in ``completion_ids``.
        anchors: each model turn's anchor state (:func:`rag_gym.train.credit.anchor` of
            ``observations`` before it).
        observations: what the env has shown: the first observation, then one per step.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    text: str = ""
    episode_return: float = 0.0
    reward_terms: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    num_searches: int = 0
    finished: bool = False
    cut: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    index: int = -1
    trace: dict[str, Any] = field(default_factory=dict)
    turn_rewards: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)

    @property
    def model_tokens(self) -> int:
        return sum(self.env_mask)

    @property
    def em(self) -> float:
        """Exact match of the final answer (0 when the episode gave none)."""
        return float((self.info.get("scores") or {}).get("em", 0.0))

    @property
    def refused(self) -> bool:
        """The episode ended in a REFUSE."""
        return self.info.get("action_type") == "REFUSE"

    @property
    def solved(self) -> bool:
        """The episode's outcome is right: an exact-match answer to an answerable question, or a
        refusal of an unanswerable one (DAPO's accuracy, which its dynamic sampling filters on).
        Exact match whatever the env's answer reward is (an F1 reward's partial answers count
        as wrong here)."""
        if self.info.get("answerable", True):
            return self.em >= 1.0
        return self.refused


def action_stops(env: gym.Env) -> list[str]:
    """The stop strings that end a turn in ``env``: the closing action tags of its
    :class:`~rag_gym.wrappers.TextActions` tag set (not ``</evaluate>``: Eval-RAR writes an
    evaluation and a search in one turn); ``</answer>`` for the reader env; none for the tree env
    (one expansion is a whole reply)."""
    from rag_gym.agents.search_r1 import turn_stops
    from rag_gym.envs.reader import ReaderEnv
    from rag_gym.wrappers.text_actions import text_actions_of

    text = text_actions_of(env)
    if text is not None:
        return list(turn_stops(text.tags))  # the search_r1 agent stops at the same strings
    if isinstance(env.unwrapped, ReaderEnv):
        return ["</answer>"]
    return []


def first_messages(env: gym.Env, obs: str) -> list[dict[str, str]]:
    """The chat an episode starts from: :meth:`TextActions.messages` when the env has it,
    else the observation as one user message."""
    inner = env
    while isinstance(inner, gym.Wrapper):
        if hasattr(inner, "messages") and callable(inner.messages):
            return inner.messages()
        inner = inner.env
    return [{"role": "user", "content": obs}]


_BULKY = ("passages", "retrieved_history", "action_mask", "reward_vector", "text")


class RolloutEngine:
    """Plays batches of episodes in copies of one env, all turns of all episodes batched.

    Args:
        make_env: builds one env (a text-action env: ``TextActions``-wrapped search env, the
            tree env or the reader env, with any reward preset). Copies are made as needed and
            reused.
        tokenizer: the policy's tokenizer (with a chat template).
        max_turns: model turns per episode at most (the env's own step limit usually ends it
            first).
        max_turn_tokens: new tokens per turn at most.
        max_completion_tokens: model + env tokens per episode at most.
        stop: stop strings ending a turn; default :func:`action_stops` of the env.
        obs_template: how an observation is inserted (``{obs}`` is replaced).
    """

    def __init__(
        self,
        make_env: Callable[[], gym.Env],
        tokenizer: Any,
        max_turns: int = 8,
        max_turn_tokens: int = 128,
        max_completion_tokens: int = 1024,
        stop: Sequence[str] | None = None,
        obs_template: str = OBS_TEMPLATE,
    ) -> None:
        for name, value in (
            ("max_turns", max_turns),
            ("max_turn_tokens", max_turn_tokens),
            ("max_completion_tokens", max_completion_tokens),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"expected {name} to be an int >= 1, got {value!r}")
        if "{obs}" not in obs_template:
            raise ValueError(f"expected obs_template to contain '{{obs}}', got {obs_template!r}")
        self.make_env = make_env
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.max_turn_tokens = max_turn_tokens
        self.max_completion_tokens = max_completion_tokens
        self.obs_template = obs_template
        self.envs: list[gym.Env] = []
        self.grow(1)
        self.stop = list(action_stops(self.envs[0]) if stop is None else stop)
        self.eos_id = tokenizer.eos_token_id

    @property
    def n_questions(self) -> int:
        """Questions in the env's split."""
        return len(self.envs[0].unwrapped.examples)

    def grow(self, n: int) -> None:
        """Make env copies until there are ``n``."""
        while len(self.envs) < n:
            self.envs.append(self.make_env())

    def call(self, method: str, *args: Any) -> None:
        """Call ``method(*args)`` on every env copy (e.g. ``engine.call("reset")``)."""
        for env in self.envs:
            getattr(env, method)(*args)

    def render_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def start(self, index: int, slot: int, seed: int | None = None) -> Episode:
        """Reset env copy ``slot`` on question ``index`` and render the prompt."""
        env = self.envs[slot]
        obs, info = env.reset(seed=seed, options={"question_index": int(index)})
        episode = Episode(
            prompt_ids=self.render_prompt(first_messages(env, obs)), index=index, observations=[obs]
        )
        episode.reward_terms = dict.fromkeys(info.get("reward_terms", {}), 0.0)
        example = getattr(env.unwrapped, "current_example", None)
        episode.trace = {
            "question_id": info.get("question_id"),
            "question": info.get("question"),
            "answers": list(getattr(example, "answers", []) or []),
            "gold_ids": list(info.get("gold_ids", [])),
            "steps": [],
            "passages": {},
        }
        return episode

    def play(
        self,
        generate: Generate,
        indices: Sequence[int],
        seed: int | None = None,
        prefixes: Sequence[Sequence[str]] | None = None,
    ) -> list[Episode]:
        """Play one episode per question index (repeat an index for a group), all at once.

        ``prefixes`` replays given action texts before the model's first turn (their tokens
        are not part of the completion; the prompt is the observation after them as one user
        message): R²AG's forest contexts. ``seed`` seeds the env resets. A generator with a
        ``session()`` (:class:`Sampler`) keeps each episode's cache across its turns.
        """
        session = getattr(generate, "session", None)
        with session() if session is not None else contextlib.nullcontext():
            return self._play(generate, indices, seed, prefixes)

    def _play(
        self,
        generate: Generate,
        indices: Sequence[int],
        seed: int | None,
        prefixes: Sequence[Sequence[str]] | None,
    ) -> list[Episode]:
        n = len(indices)
        self.grow(n)
        episodes = []
        for slot, index in enumerate(indices):
            ep = self.start(index, slot, None if seed is None else seed + slot)
            if prefixes is not None and prefixes[slot]:
                env = self.envs[slot]
                obs = ""
                for text in prefixes[slot]:
                    obs, _, term, trunc, _ = env.step(text)
                    if term or trunc:
                        raise ValueError(
                            f"prefix {slot} ends the episode of question {index}; a forest "
                            "context must leave the episode running"
                        )
                ep.prompt_ids = self.render_prompt([{"role": "user", "content": obs}])
                ep.observations = [obs]
            episodes.append(ep)
        if getattr(generate, "concurrent_clients", False):  # each episode in one running batch
            generate.run_clients(
                [
                    self._client(generate, ep, env)
                    for ep, env in zip(episodes, self.envs[:n], strict=True)
                ]
            )
            active = []
        else:  # turn by turn, every active episode in one call
            active = list(range(n))
        while active:
            budgets = [self.max_completion_tokens - len(episodes[i].completion_ids) for i in active]
            new = generate(
                [episodes[i].prompt_ids + episodes[i].completion_ids for i in active],
                max(1, min(self.max_turn_tokens, min(budgets))),
                self.stop,
            )
            still = []
            for i, tokens in zip(active, new, strict=True):
                if self.advance(episodes[i], self.envs[i], list(tokens)):
                    still.append(i)
            active = still
        for ep in episodes:
            ep.text = self.tokenizer.decode(ep.completion_ids, skip_special_tokens=True)
        return episodes

    def _client(self, generate: Generate, ep: Episode, env: gym.Env) -> Callable[[], None]:
        """One episode played to its end, one ``generate`` call per turn (a client of
        :meth:`Sampler.run_clients`: its turns join the running batch, so an episode
        whose reply is done steps its env and goes on while others still decode)."""

        def play() -> None:
            while True:
                budget = self.max_completion_tokens - len(ep.completion_ids)
                [tokens] = generate(
                    [ep.prompt_ids + ep.completion_ids],
                    max(1, min(self.max_turn_tokens, budget)),
                    self.stop,
                )
                if not self.advance(ep, env, list(tokens)):
                    return

        return play

    def advance(self, ep: Episode, env: gym.Env, tokens: list[int]) -> bool:
        """Apply one model turn (``tokens``) to ``ep`` in ``env``: step the env, add the reward,
        append the observation's tokens; ``True`` while the episode goes on. :meth:`play` calls
        it for every active episode; EVO-RAG's sibling branches call it to continue an episode
        from a replayed state."""
        ep.anchors.append(anchor(ep.observations))
        ep.turn_spans.append((len(ep.completion_ids), len(ep.completion_ids) + len(tokens)))
        ep.completion_ids += tokens
        ep.env_mask += [1] * len(tokens)
        ep.turns += 1
        action = self.tokenizer.decode(tokens, skip_special_tokens=True)
        obs, reward, terminated, truncated, info = env.step(action)
        ep.episode_return += float(reward)
        ep.turn_rewards.append(float(reward))
        ep.observations.append(obs)
        for key, value in info.get("reward_terms", {}).items():
            ep.reward_terms[key] = ep.reward_terms.get(key, 0.0) + float(value)
        ep.num_searches = int(info.get("num_searches", ep.num_searches))
        if ep.trace:
            _trace(ep.trace, action, info, float(reward), len(tokens), env)
        ep.info = {k: v for k, v in info.items() if k not in _BULKY}
        if terminated or truncated:
            ep.finished = True
            if not ep.completion_ids or ep.completion_ids[-1] != self.eos_id:
                ep.completion_ids.append(self.eos_id)
                ep.env_mask.append(0)
            return False
        room = self.max_completion_tokens - len(ep.completion_ids)
        if ep.turns >= self.max_turns or room <= 0:
            ep.cut = True
            return False
        obs_ids = self.tokenizer.encode(
            self.obs_template.format(obs=obs) if obs else "\n", add_special_tokens=False
        )
        if len(obs_ids) >= room:  # no room left for the model to act after it
            ep.completion_ids += obs_ids[:room]
            ep.env_mask += [0] * min(room, len(obs_ids))
            ep.cut = True
            return False
        ep.completion_ids += obs_ids
        ep.env_mask += [0] * len(obs_ids)
        return True


def _trace(trace: dict[str, Any], action: str, info: dict, reward: float, n: int, env) -> None:
    """Add one model turn to an episode's trace (see :mod:`rag_gym.traces`)."""
    gold = trace.get("gold_ids", [])
    step = traces.step_record(len(trace["steps"]) + 1, action, info, reward, gold, None, 0, n)
    trace["steps"].append(step)
    ids = [r["id"] for r in step["retrieved"]] + [g for g in gold if g not in trace["passages"]]
    new = [i for i in ids if i not in trace["passages"]]
    trace["passages"].update(traces.passages_of(info, getattr(env.unwrapped, "corpus", None), new))

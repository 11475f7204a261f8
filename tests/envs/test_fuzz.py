"""Property-based fuzzing: 10,000 random and adversarial actions per env kind, no crash.

For each kind (search with Dict actions, search through TextActions, the retrieval tree, the
reader) hypothesis draws 500 sequences of 20 actions — random Unicode, huge strings, tag soup
with nested and unclosed tags, many tags at once, random Dict actions — and plays them. Every
observation must lie in the observation space, every episode must end by the env's step limit,
and actions outside a Dict action space must raise a typed error and leave the env usable.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rag_gym  # noqa: F401
from rag_gym.envs.spaces import text_charset
from rag_gym.wrappers import TextActions
from tests.conftest import SMALL_WORLD

EXAMPLES, LENGTH = 500, 20  # 10,000 actions per kind
CHARSET = text_charset()

FRAGMENTS = [
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "<evaluate>",
    "</evaluate>",
    "<backtrack/>",
    "<refuse/>",
    "<refuse>",
    "</refuse>",
    "<information>",
    "</information>",
    "<reflect>",
    "</reflect>",
    "<base-Q>",
    "</base-Q>",
    "<predicted-Q>",
    "</predicted-Q>",
    "stop retrieval",
    "none",
    "<relevance>",
    "</relevance>",
    "[1, 5]",
    "[999999999999999999999]",
    "<analysis>",
    "</analysis>",
    "Ada",
    "born",
    "city",
    " ",
    "\n",
    "<",
    ">",
    "/",
    "漢",
    "\U0001f600",
    "\x00",
    "\r\n",
    "< search >",
]
tag_soup = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)
huge = st.builds(
    lambda c, n: c * n,
    st.sampled_from(["x", "<search>", "漢", "\U0001f600 ", "a b "]),
    st.integers(1_000, 80_000),
)
# "<" then a long run of whitespace: the shape that made a regex with two adjacent \s* quadratic
stalled_tag = st.builds(
    lambda pad, n, tail: "<" + pad * n + tail,
    st.sampled_from([" ", "\t", " \n", "/ ", "search "]),
    st.integers(1_000, 16_383),
    st.sampled_from(["", "search>q</search>", "answer", "/>", "<answer>x</answer>"]),
)
text_actions = st.one_of(st.text(max_size=300), tag_soup, huge, stalled_tag, st.just(""))
printable = st.characters(max_codepoint=0xFFFF, exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn"))
dict_actions = st.fixed_dictionaries(
    {
        "type": st.integers(0, 4),
        "text": st.one_of(
            st.text(printable, max_size=600),
            tag_soup.map(lambda s: "".join(c for c in s if c in CHARSET)),
            st.just(""),
        ),
    }
)
bad_dict_actions = st.one_of(
    st.fixed_dictionaries({"type": st.integers(5, 99), "text": st.just("x")}),
    st.fixed_dictionaries(
        {"type": st.integers(0, 4), "text": st.text(alphabet="\x00\x07\U0001f600", min_size=1)}
    ),
    st.just({"type": 0}),
    st.just("SEARCH x"),
    st.just({"type": 0, "text": 5}),
)

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


def play(env, actions, limit, counter):
    obs, _ = env.reset(seed=len(counter))
    steps = 0
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        counter.append(1)
        steps += 1
        assert env.observation_space.contains(obs)
        assert isinstance(reward, float)
        if terminated or truncated:
            assert steps <= limit
            obs, _ = env.reset()
            steps = 0
        assert steps < limit or limit == 0


@pytest.fixture(scope="module")
def envs():
    kw = {"dataset_kwargs": SMALL_WORLD}
    return {
        "search": gym.make("rag_gym/SynthHop-Hard-v0", **kw),
        "text": TextActions(gym.make("rag_gym/SynthHop-Hard-v0", **kw)),
        "tree": gym.make("rag_gym/SynthHop-Hard-Tree-v0", **kw),
        "reader": gym.make("rag_gym/SynthHop-Hard-Reader-v0", **kw),
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["search", "text", "tree", "reader"])
def test_fuzz_10k_actions(envs, kind):
    env = envs[kind]
    limit = env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 1
    counter: list[int] = []
    strategy = dict_actions if kind == "search" else text_actions

    @FUZZ
    @given(st.lists(strategy, min_size=LENGTH, max_size=LENGTH))
    def run(actions):
        play(env, actions, limit, counter)

    run()
    assert len(counter) >= EXAMPLES * LENGTH


@pytest.mark.slow
def test_fuzz_out_of_space_dict_actions_raise_typed_errors(envs):
    env = envs["search"]

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(bad_dict_actions)
    def run(action):
        env.reset(seed=0)
        assert not env.action_space.contains(action)
        with pytest.raises((TypeError, ValueError)):
            env.step(action)
        obs, *_ = env.step({"type": 4, "text": "still usable"})
        assert env.observation_space.contains(obs)

    run()


# the tag pattern as it was before parsing was made linear: the reference for what it finds
_REFERENCE_TAG = r"<\s*(/?)\s*([A-Za-z][\w-]*)\s*(/?)\s*>"


@settings(max_examples=2_000, deadline=None, database=None, derandomize=True)
@given(st.text(alphabet="<>/ \tab-_1\n", max_size=40))
def test_tag_pattern_finds_what_the_reference_pattern_finds(text):
    import re

    from rag_gym.envs.tags import _TAG

    def found(pattern):
        return [
            (m.span(), bool(m.group(1)), m.group(2), bool(m.group(3)))
            for m in pattern.finditer(text)
        ]

    assert found(_TAG) == found(re.compile(_REFERENCE_TAG))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<" + " " * 16_383, []),
        ("<" + " " * 16_383 + "search>q</search>", [("search", "q")]),
        ("<search" + " " * 16_383, []),
        ("<search" + " " * 16_383 + "/" + " " * 16_383 + ">", []),
        ("< /" + "\t" * 16_383 + "answer>", []),
        ("<answer>" + " " * 16_383 + "<" + " " * 16_383 + "</answer>", [("answer", "<")]),
        ("<refuse" + " " * 16_383 + "/" + " " * 16_383 + ">", [("refuse", "")]),
    ],
)
def test_long_whitespace_inside_a_tag_parses_to_the_right_tags(text, expected):
    from rag_gym.envs.tags import parse

    parsed = parse(text, self_closing=frozenset({"refuse"}))
    assert [(t.name, t.content) for t in parsed.tags] == expected


@pytest.mark.parametrize("kind", ["text", "tree", "reader"])
def test_a_stalled_tag_is_an_ordinary_bad_action(envs, kind):
    env = envs[kind]
    env.reset(seed=0)
    obs, reward, _, _, info = env.step("<" + " " * 16_383)
    assert env.observation_space.contains(obs)
    assert info["format_ok"] is False and reward <= 0.0

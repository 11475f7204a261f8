"""Env arguments of the wrong type are refused at construction with "expected", never taken
for something else (the string "false" as true) or left to an AttributeError deep inside."""

from __future__ import annotations

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401  (registers the envs)
from tests.conftest import SMALL_WORLD


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exclude_seen": "false"}, "expected exclude_seen to be a bool .*got str: 'false'"),
        ({"exclude_seen": 1}, "expected exclude_seen to be a bool .*got int: 1"),
        ({"retriever": 5}, "expected retriever to be a server URL .*got int: 5"),
        ({"examples": "abc"}, "expected examples to be a sequence of QAExample .*got str"),
        ({"examples": [1, 2]}, "expected examples to be a sequence of QAExample .*holding int 1"),
    ],
)
def test_arguments_of_the_wrong_type_are_refused(kwargs, message):
    with pytest.raises(TypeError, match=message):
        gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD, **kwargs)


def test_a_bool_exclude_seen_is_taken():
    import numpy as np

    env = gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD, exclude_seen=np.bool_(True))
    assert env.unwrapped.exclude_seen is True

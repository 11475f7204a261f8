import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rag_gym.train.options import parse_config

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class _Cfg:
    name: str = "x"
    steps: int = 2
    lr: float = 1e-3
    track: bool = field(default=True, metadata={"help": "log it"})


def test_parse_config_reads_each_field_type_and_keeps_defaults():
    assert parse_config(_Cfg, []) == _Cfg()
    cfg = parse_config(_Cfg, ["--name", "y", "--steps", "5", "--lr", "0.5", "--no-track"])
    assert cfg == _Cfg(name="y", steps=5, lr=0.5, track=False)


def test_parse_config_refuses_bad_values_and_types(capsys):
    with pytest.raises(SystemExit):
        parse_config(_Cfg, ["--steps", "many"])
    assert "invalid int value" in capsys.readouterr().err

    @dataclass
    class Listy:
        names: list = field(default_factory=list)

    with pytest.raises(TypeError, match=r"Listy\.names"):
        parse_config(Listy, [])
    with pytest.raises(TypeError, match="expected a dataclass"):
        parse_config(dict, [])


def test_examples_take_the_librarys_config_dataclasses():
    # every example's settings live in the library (a config dataclass parsed by TrlParser or
    # parse_config), never in a dataclass of the script's own
    for path in sorted((ROOT / "examples").glob("*.py")):
        tree = ast.parse(path.read_text())
        own = [
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and any(
                getattr(d, "id", getattr(d, "attr", None)) == "dataclass"
                for d in node.decorator_list
            )
        ]
        assert own in ([], ["ScriptArguments"]), f"{path.name} defines its own config: {own}"

"""Does a title-list policy compare the titles with the entity it searched? Read its transcripts.

A policy trained with ``rag-gym train sft --style title_list`` (or ``title_verdicts``, options
up to revision 73708d1f8b59) starts
each turn after a search with the titles that came back, e.g. ``Looking for Tribrigrok
Institute: Doc 1 is about Tribrigrok Institute (yes), Doc 2 is about …``, and then either
reads a document (``Doc 1 says …``) or says the search missed (``None is about …``). This
script checks those turns against the passages the env really returned, from an evaluation's
trace files (``rag-gym evaluate`` writes ``steps.jsonl``, ``passages.jsonl`` and
``episodes.jsonl`` into its run folder)::

    python docs/results/scripts/read_verdicts.py runs/test-hard-verdicts

For each agent it prints one JSON line:

- ``lists``: turns that list titles after a search; ``titles_right``: listed titles equal to
  the retrieved passage's real title.
- ``verdicts`` / ``verdicts_right``: ``(yes)``/``(no)`` marks, right when ``(yes)`` stands
  exactly where the real title is the entity searched.
- ``hit_lists``: lists whose passages hold the entity; ``hit_read``: of those, turns that read
  the document whose title is the entity. ``miss_lists``: lists that do not hold it;
  ``miss_said``: of those, turns that say the search missed; ``miss_read``: turns that read a
  document anyway.
- per kind of question (``answerable`` / ``unanswerable``): episodes, refusals, exact matches.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from rag_gym.traces import read_jsonl

LOOKING = re.compile(r"Looking for (?P<entity>[^:]+): (?P<list>.*?)(?:\.\s|\.$|\.<|$)", re.S)
LISTED = re.compile(r"Doc (?P<rank>\d+) is about (?P<title>.+?)(?: \((?P<verdict>yes|no)\))?$")
#: the readings the expert writes (``rag_gym.agents.expert``): ``Doc 2 says …``, ``According to
#: Doc 2, …``, ``From Doc 2: …``, ``Doc 2 tells me …``, and the forms that name the title
READS = re.compile(
    r"(?:According to |From )Doc (?P<rank>\d+)[,:]|Doc (?P<rank2>\d+) (?:says|tells|is the one|is titled)"
)
MISS = ("None is about", "None of these is about", "not {X}")


def jsonl(path: Path) -> list[dict]:
    """The records of a trace file, read as the viewer reads them (a line cut by a kill is
    skipped with a warning on stderr)."""
    records, problems = read_jsonl(path)
    for problem in problems:
        print(problem, file=sys.stderr)
    return [record for record, _ in records]


def check_turn(text: str, retrieved: list[dict], titles: dict[str, str], tally: Counter) -> None:
    """Tally one model turn that follows a search returning ``retrieved``."""
    found = LOOKING.search(text)
    if not found:
        return
    entity = found["entity"].strip()
    real = {int(hit["rank"]): titles.get(hit["id"], "") for hit in retrieved}
    tally["lists"] += 1
    for item in found["list"].split(", "):
        listed = LISTED.match(item.strip().rstrip("."))
        if not listed:
            continue
        actual = real.get(int(listed["rank"]), "")
        tally["titles"] += 1
        tally["titles_right"] += listed["title"] == actual
        if listed["verdict"]:
            tally["verdicts"] += 1
            tally["verdicts_right"] += (listed["verdict"] == "yes") == (actual == entity)
    rest = text[found.end() :]
    read = READS.search(rest)
    read_rank = int(read["rank"] or read["rank2"]) if read else None
    said_miss = any(marker.replace("{X}", entity) in rest for marker in MISS)
    if entity in real.values():
        tally["hit_lists"] += 1
        tally["hit_read"] += read_rank is not None and real.get(read_rank) == entity
    else:
        tally["miss_lists"] += 1
        tally["miss_said"] += said_miss
        tally["miss_read"] += bool(read) and not said_miss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder of rag-gym evaluate")
    args = parser.parse_args()
    for name in ("steps.jsonl", "passages.jsonl", "episodes.jsonl"):
        if not (args.run / name).is_file():
            parser.error(f"{args.run / name} is missing: give a run folder of rag-gym evaluate")
    titles = {p["id"]: p.get("title", "") for p in jsonl(args.run / "passages.jsonl")}
    tallies: dict[str, Counter] = defaultdict(Counter)
    for trace in jsonl(args.run / "steps.jsonl"):
        tally = tallies[trace["agent"]]
        steps = trace["steps"]
        for before, after in itertools.pairwise(steps):
            if before.get("action") == "SEARCH" and before.get("retrieved"):
                check_turn(after.get("raw_output") or "", before["retrieved"], titles, tally)
    for episode in jsonl(args.run / "episodes.jsonl"):
        kind = "answerable" if episode.get("answerable", True) else "unanswerable"
        tally = tallies[episode["agent"]]
        tally[kind] += 1
        tally[f"{kind}_refused"] += bool(episode.get("refused"))
        tally[f"{kind}_em"] += episode.get("em", 0.0) >= 1.0
    for agent, tally in tallies.items():
        print(json.dumps({"agent": agent, **tally}))


if __name__ == "__main__":
    main()

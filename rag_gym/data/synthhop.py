"""SynthHop: a procedurally generated, fictional multi-hop world that needs no download.

Every feature of rag-gym runs on SynthHop offline, and no language model can answer its
questions from memory: the entities (people, cities, countries, organisations and written works)
have generated names and random facts.

World
    One passage per entity, stating only that entity's own facts::

        Taveruk Dronalis is a cartographer born in 1962 in Velmoran. Taveruk Dronalis works for
        Korvashin Guild and studied under Ilo Brathemex.

    No passage states an inverse relation (a city's page never lists who was born there), so an
    n-hop question needs n retrievals.

Questions
    * compositional chains of 2, 3 or 4 hops built from the relations ``author``, ``publisher``
      (work), ``birthplace``, ``employer``, ``mentor`` (person), ``headquarters``, ``founder``
      (organisation), ``country`` (city) and ``capital`` (country), ending on an entity or on an
      attribute (a year, a currency, an occupation);
    * comparisons of two entities of one type by year ("Who was born first, A or B?").

    Each question carries its gold passage ids in hop order and its decomposition
    (``meta["decomposition"]``: one sub-question, answer and passage per hop). A question is
    kept only if no passage that names its starting entity also names its answer (and, for a
    comparison, no passage names both entities), so one retrieval cannot answer it.

Unanswerable questions
    At ``unanswerable_rate``, a question's chain has exactly one needed passage (hop 2 or later)
    left out of the corpus on purpose; the right behaviour is to refuse. Removed passages never
    belong to another question's chain.

Pools and splits
    Each question has a distractor pool (its present gold passages plus hard negatives: entities
    of the same type that share a surname, a suffix, a title noun or a country; ``pool_size``
    passages in all), and the whole world is the full corpus. Train, validation and test are
    disjoint in questions.

>>> world = generate(SynthHopConfig(n_passages=2000, n_questions=(40, 10, 10), seed=1))
>>> len(world.corpus) > 1900, len(world.questions["validation"])
(True, 10)
>>> ex = world.questions["validation"][0]
>>> ex.hops == len(ex.supporting_ids) == len(ex.meta["decomposition"])
True
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym._names import unknown_name
from rag_gym.data.splits import canonical_split
from rag_gym.data.types import Corpus, QAExample

SPLITS = ("train", "validation", "test")

# ---- names ----------------------------------------------------------------------------------
_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "th",
    "sh",
    "dr",
    "kr",
    "br",
    "gr",
    "tr",
    "vr",
    "zh",
    "kh",
)
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou", "ia")
_CODAS = ("", "n", "r", "s", "th", "l", "x", "k", "m")
_SYLLABLES = tuple(o + v for o in _ONSETS for v in _VOWELS)

_OCCUPATIONS = (
    "cartographer",
    "botanist",
    "architect",
    "composer",
    "engineer",
    "historian",
    "painter",
    "physician",
    "astronomer",
    "sculptor",
    "linguist",
    "chemist",
    "navigator",
    "poet",
    "jurist",
    "weaver",
)
_ORG_KINDS = (
    ("Institute", "research institute"),
    ("Guild", "craft guild"),
    ("Dynamics", "engineering firm"),
    ("Press", "publishing house"),
    ("Collective", "artists' collective"),
    ("Foundry", "metalworks"),
    ("Observatory", "observatory"),
    ("Trading Company", "trading company"),
    ("Academy", "academy"),
    ("Bank", "bank"),
)
_WORK_NOUNS = (
    "Lantern",
    "Harbor",
    "Orchard",
    "Compass",
    "Archive",
    "Tide",
    "Meridian",
    "Garden",
    "Atlas",
    "Bell",
    "Mirror",
    "Citadel",
    "Voyage",
    "Ember",
    "Quarry",
    "Loom",
    "Canticle",
    "Estuary",
    "Lighthouse",
    "Almanac",
)
_GENRES = ("novel", "play", "treatise", "poetry collection", "memoir", "chronicle", "essay")
_CURRENCY_UNITS = ("crown", "mark", "florin", "talent", "shell", "ducat")


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


# ---- relations --------------------------------------------------------------------------------
# name: (source type, target type or None for an attribute, nested phrase, question template)
RELATIONS: dict[str, tuple[str, str | None, str, str]] = {
    "author": ("work", "person", "the author of {X}", "Who wrote {X}?"),
    "publisher": ("work", "org", "the publisher of {X}", "Which organisation published {X}?"),
    "published_year": ("work", None, "", "In what year was {X} published?"),
    "birthplace": ("person", "city", "the birthplace of {X}", "Where was {X} born?"),
    "employer": ("person", "org", "the employer of {X}", "Which organisation employs {X}?"),
    "mentor": ("person", "person", "the mentor of {X}", "Who was the mentor of {X}?"),
    "birth_year": ("person", None, "", "In what year was {X} born?"),
    "occupation": ("person", None, "", "What is the occupation of {X}?"),
    "headquarters": (
        "org",
        "city",
        "the headquarters city of {X}",
        "In which city is {X} headquartered?",
    ),
    "founder": ("org", "person", "the founder of {X}", "Who founded {X}?"),
    "founded_year": ("org", None, "", "In what year was {X} founded?"),
    "country": ("city", "country", "the country of {X}", "In which country is {X}?"),
    "capital": ("country", "city", "the capital of {X}", "What is the capital of {X}?"),
    "currency": ("country", None, "", "What is the currency of {X}?"),
}
_COMPARISONS = {
    "person": ("birth_year", "Who was born first, {A} or {B}?"),
    "org": ("founded_year", "Which was founded earlier, {A} or {B}?"),
    "work": ("published_year", "Which was published first, {A} or {B}?"),
}
_TYPES = ("person", "city", "country", "org", "work")
_PREFIX = {"person": "P", "city": "C", "country": "K", "org": "O", "work": "W"}


@dataclass(frozen=True)
class SynthHopConfig:
    """Parameters of a SynthHop world. Same config (and seed) → the same world, byte for byte."""

    seed: int = 0
    """Seed of every random choice."""
    n_passages: int = 10_000
    """Number of entities (one passage each) before unanswerable questions remove theirs."""
    hops: tuple[int, ...] = (2,)
    """Hop counts of compositional questions, sampled uniformly (each in 2..4)."""
    comparison_rate: float = 0.2
    """Fraction of questions that compare two entities (2 hops)."""
    unanswerable_rate: float = 0.0
    """Fraction of questions, per split, whose chain misses exactly one passage."""
    n_questions: tuple[int, int, int] = (1000, 200, 200)
    """Questions in the train, validation and test splits."""
    pool_size: int = 10
    """Passages in each question's distractor pool (gold + hard negatives)."""

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"expected an int seed, got {self.seed!r}")
        if self.seed < 0:
            raise ValueError(f"expected seed >= 0 (numpy takes no negative seeds), got {self.seed}")
        for name in ("hops", "n_questions"):
            if not isinstance(getattr(self, name), (tuple, list)):
                example = "(2,) or (2, 3, 4)" if name == "hops" else "(1000, 200, 200)"
                raise TypeError(
                    f"expected {name} as a tuple, e.g. {example}, got {getattr(self, name)!r}"
                )
        if not isinstance(self.n_passages, int) or self.n_passages < 500:
            raise ValueError(f"expected n_passages >= 500, got {self.n_passages!r}")
        hops = tuple(self.hops)
        if not hops or any(h not in (2, 3, 4) for h in hops):
            raise ValueError(f"expected hops from (2, 3, 4), got {self.hops!r}")
        object.__setattr__(self, "hops", hops)
        for name in ("comparison_rate", "unanswerable_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"expected {name} in [0, 1], got {rate!r}")
        nq = tuple(self.n_questions)
        if len(nq) != 3 or any(not isinstance(n, int) or n < 0 for n in nq):
            raise ValueError(
                f"expected n_questions as (train, validation, test) counts, got {self.n_questions!r}"
            )
        object.__setattr__(self, "n_questions", nq)
        if sum(nq) > self.n_passages // 4:
            raise ValueError(
                f"expected at most n_passages // 4 = {self.n_passages // 4} questions in all, got {sum(nq)}; "
                "raise n_passages or lower n_questions"
            )
        if not 2 <= self.pool_size <= 100:
            raise ValueError(f"expected pool_size in [2, 100], got {self.pool_size!r}")


PRESETS: dict[str, SynthHopConfig] = {
    "default": SynthHopConfig(),
    "hard": SynthHopConfig(hops=(2, 3, 4), comparison_rate=0.1, unanswerable_rate=0.1, seed=1),
}


@dataclass
class SynthHopWorld:
    """A generated world: the corpus, the questions per split and the config that made them."""

    config: SynthHopConfig
    corpus: Corpus
    questions: dict[str, list[QAExample]]
    removed_ids: tuple[str, ...] = field(default_factory=tuple)

    def save(self, out_dir: str | Path) -> Path:
        """Write ``corpus.jsonl`` (``{id, title, text}``), ``<split>.jsonl`` and ``config.json``."""
        import json

        from rag_gym import __version__

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.corpus.to_jsonl(out / "corpus.jsonl", fmt="title_text")
        for split, examples in self.questions.items():
            with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for ex in examples:
                    f.write(json.dumps(asdict(ex), ensure_ascii=False) + "\n")
        params = {
            "rag_gym_version": __version__,
            "config": asdict(self.config),
            "n_passages": len(self.corpus),
            "removed_ids": list(self.removed_ids),
        }
        (out / "config.json").write_text(json.dumps(params, indent=2) + "\n")
        return out


@functools.lru_cache(maxsize=4)
def generate(config: SynthHopConfig = PRESETS["default"]) -> SynthHopWorld:
    """Generate (or return the cached) world for ``config``."""
    return _Generator(config).run()


def load(
    path: str | Path | None = None,
    split: str = "validation",
    preset: str = "default",
    **overrides: Any,
) -> list[QAExample]:
    """Questions of one split of a preset world (``"default"`` or ``"hard"``), with overrides.

    ``path`` is accepted for symmetry with the file loaders and must be ``None``.
    """
    if path is not None:
        raise ValueError(
            "SynthHop is generated, not read from a file; drop path=... (use preset= and overrides)"
        )
    return world_for(preset, **overrides).questions[_check_split(split)]


def world_for(preset: str = "default", **overrides: Any) -> SynthHopWorld:
    """The world of a named preset, with config fields overridden."""
    if preset not in PRESETS:
        raise unknown_name("SynthHop preset", preset, PRESETS)
    base = asdict(PRESETS[preset])
    unknown = set(overrides) - set(base)
    if unknown:
        raise TypeError(
            f"unknown SynthHop config fields {sorted(unknown)}; expected some of {sorted(base)}"
        )
    base.update(overrides)
    for key in ("hops", "n_questions"):
        if isinstance(base[key], list):  # JSON kwargs give lists
            base[key] = tuple(base[key])
    return generate(SynthHopConfig(**base))


def _check_split(split: str) -> str:
    """The split of :data:`SPLITS` that ``split`` names (``"dev"``: ``"validation"``)."""
    return canonical_split(split)


# ---- generation -------------------------------------------------------------------------------
def _decode_words(codes: np.ndarray, n_syl: int, rng_codas: np.ndarray) -> list[str]:
    ns = len(_SYLLABLES)
    parts = []
    rest = codes.copy()
    for _ in range(n_syl):
        parts.append(rest % ns)
        rest //= ns
    syl = np.array(_SYLLABLES, dtype=object)
    coda = np.array(_CODAS, dtype=object)
    words = syl[parts[0]]
    for p in parts[1:]:
        words = words + syl[p]
    words = words + coda[rng_codas]
    return [w.capitalize() for w in words.tolist()]


def _currency_syllables(n_countries: int) -> int:
    """Syllables of the currency words: two while they are plentiful (every world up to about
    10M passages, so those worlds are unchanged), three beyond (a 21M-passage world, Search-R1's
    scale, has 210,000 countries)."""
    return 2 if n_countries <= len(_SYLLABLES) ** 2 * len(_CODAS) // 4 else 3


def _unique_words(rng: np.random.Generator, n: int, n_syl: int) -> list[str]:
    """``n`` distinct generated words of ``n_syl`` syllables plus an optional coda."""
    space = len(_SYLLABLES) ** n_syl * len(_CODAS)
    if n > space // 4:
        raise ValueError(f"cannot draw {n} distinct {n_syl}-syllable names")
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        m = int((n - len(out)) * 1.1) + 16
        codes = rng.integers(0, len(_SYLLABLES) ** n_syl, size=m)
        codas = rng.integers(0, len(_CODAS), size=m)
        for w in _decode_words(codes, n_syl, codas):
            if w not in seen:
                seen.add(w)
                out.append(w)
                if len(out) == n:
                    break
    return out


class _Generator:
    def __init__(self, config: SynthHopConfig) -> None:
        self.cfg = config
        self.rng = np.random.default_rng(config.seed)

    # -- world --
    def run(self) -> SynthHopWorld:
        self._entities()
        self._facts()
        self._referrers()
        questions, removed = self._questions()
        corpus = self._corpus(removed)
        self._pools(questions, removed, corpus)
        world_questions = {
            split: [self._example(q, corpus) for q in qs] for split, qs in questions.items()
        }
        removed_ids = tuple(sorted(self.ids[t][i] for t, i in removed))
        return SynthHopWorld(self.cfg, corpus, world_questions, removed_ids)

    def _entities(self) -> None:
        n = self.cfg.n_passages
        counts = {
            "country": max(6, n // 100),
            "city": max(20, int(n * 0.15)),
            "org": max(20, int(n * 0.15)),
            "work": max(20, int(n * 0.28)),
        }
        counts["person"] = n - sum(counts.values())
        self.counts = counts
        rng = self.rng
        n_last = max(10, counts["person"] // 3)
        unique = _unique_words(
            rng, counts["country"] + counts["city"] + counts["org"] + counts["work"] + n_last, 3
        )
        unique_set = set(unique)
        firsts = [w for w in _unique_words(rng, 600, 2) if w not in unique_set]
        pos = 0

        def take(k: int) -> list[str]:
            nonlocal pos
            pos += k
            return unique[pos - k : pos]

        self.names: dict[str, list[str]] = {}
        self.names["country"] = take(counts["country"])
        self.names["city"] = take(counts["city"])
        org_words = take(counts["org"])
        self.org_kind = rng.integers(0, len(_ORG_KINDS), size=counts["org"])
        self.names["org"] = [
            f"{w} {_ORG_KINDS[k][0]}"
            for w, k in zip(org_words, self.org_kind.tolist(), strict=True)
        ]
        work_words = take(counts["work"])
        self.work_noun = rng.integers(0, len(_WORK_NOUNS), size=counts["work"])
        self.names["work"] = [
            f"The {w} {_WORK_NOUNS[k]}"
            for w, k in zip(work_words, self.work_noun.tolist(), strict=True)
        ]
        lasts = take(n_last)
        npers = counts["person"]
        # unique (first, last) pairs
        pair_space = len(firsts) * len(lasts)
        codes = (
            rng.choice(pair_space, size=npers, replace=False) if pair_space < 5 * npers else None
        )
        if codes is None:
            chosen: dict[int, None] = {}
            while len(chosen) < npers:
                for c in rng.integers(0, pair_space, size=npers - len(chosen) + 16).tolist():
                    chosen.setdefault(c, None)
                    if len(chosen) == npers:
                        break
            codes = np.fromiter(chosen, dtype=np.int64, count=npers)
        self.person_last = codes % len(lasts)
        first_idx = codes // len(lasts)
        self.names["person"] = [
            f"{firsts[f]} {lasts[la]}"
            for f, la in zip(first_idx.tolist(), self.person_last.tolist(), strict=True)
        ]
        self.ids = {t: [f"{_PREFIX[t]}{i:07d}" for i in range(counts[t])] for t in _TYPES}

    def _facts(self) -> None:
        rng, c = self.rng, self.counts
        self.city_country = rng.integers(0, c["country"], size=c["city"])
        self.city_founded = rng.integers(800, 1700, size=c["city"])
        # capital: one city of the country (countries without cities get a new random one)
        capital = rng.integers(0, c["city"], size=c["country"])
        first_city: dict[int, int] = {}
        for city, k in enumerate(self.city_country.tolist()):
            first_city.setdefault(k, city)
        for k, city in first_city.items():
            capital[k] = city
        self.city_country[capital] = np.arange(c["country"])  # a capital lies in its country
        self.country_capital = capital
        self.country_year = rng.integers(900, 1900, size=c["country"])
        currency_words = _unique_words(rng, c["country"], _currency_syllables(c["country"]))
        self.country_currency = [
            f"{w.lower()} {_CURRENCY_UNITS[i % len(_CURRENCY_UNITS)]}"
            for i, w in enumerate(currency_words)
        ]
        self.person_birth = rng.integers(1700, 2000, size=c["person"])
        self.person_city = rng.integers(0, c["city"], size=c["person"])
        self.person_org = rng.integers(0, c["org"], size=c["person"])
        self.person_occ = rng.integers(0, len(_OCCUPATIONS), size=c["person"])
        mentor = rng.integers(0, c["person"], size=c["person"])
        mentor[mentor == np.arange(c["person"])] = -1
        mentor[rng.random(c["person"]) < 0.2] = -1
        self.person_mentor = mentor
        self.org_city = rng.integers(0, c["city"], size=c["org"])
        self.org_founder = rng.integers(0, c["person"], size=c["org"])
        self.org_year = rng.integers(1600, 2000, size=c["org"])
        self.work_author = rng.integers(0, c["person"], size=c["work"])
        self.work_publisher = rng.integers(0, c["org"], size=c["work"])
        self.work_year = rng.integers(1700, 2020, size=c["work"])
        self.work_genre = rng.integers(0, len(_GENRES), size=c["work"])

    # The single source of truth for what each passage says.
    def _edges(self, etype: str, i: int) -> dict[str, tuple[str, int] | str]:
        if etype == "person":
            out: dict[str, tuple[str, int] | str] = {
                "birthplace": ("city", int(self.person_city[i])),
                "employer": ("org", int(self.person_org[i])),
                "birth_year": str(self.person_birth[i]),
                "occupation": _OCCUPATIONS[self.person_occ[i]],
            }
            if self.person_mentor[i] >= 0:
                out["mentor"] = ("person", int(self.person_mentor[i]))
            return out
        if etype == "city":
            return {"country": ("country", int(self.city_country[i]))}
        if etype == "country":
            return {
                "capital": ("city", int(self.country_capital[i])),
                "currency": self.country_currency[i],
            }
        if etype == "org":
            return {
                "headquarters": ("city", int(self.org_city[i])),
                "founder": ("person", int(self.org_founder[i])),
                "founded_year": str(self.org_year[i]),
            }
        return {
            "author": ("person", int(self.work_author[i])),
            "publisher": ("org", int(self.work_publisher[i])),
            "published_year": str(self.work_year[i]),
        }

    def _texts(self) -> dict[str, list[str]]:
        nm = self.names
        city, country, org, person = nm["city"], nm["country"], nm["org"], nm["person"]
        texts: dict[str, list[str]] = {}
        texts["person"] = [
            f"{person[i]} is {_a(_OCCUPATIONS[occ])} born in {by} in {city[pc]}. {person[i]} works for {org[po]}"
            + (f" and studied under {person[m]}." if m >= 0 else ".")
            for i, (occ, by, pc, po, m) in enumerate(
                zip(
                    self.person_occ.tolist(),
                    self.person_birth.tolist(),
                    self.person_city.tolist(),
                    self.person_org.tolist(),
                    self.person_mentor.tolist(),
                    strict=True,
                )
            )
        ]
        texts["city"] = [
            f"{city[i]} is a city in {country[k]}, founded in {y}."
            for i, (k, y) in enumerate(
                zip(self.city_country.tolist(), self.city_founded.tolist(), strict=True)
            )
        ]
        texts["country"] = [
            f"{country[i]} is a country whose capital is {city[cap]}. Its currency is the {cur}, and it was established in {y}."
            for i, (cap, cur, y) in enumerate(
                zip(
                    self.country_capital.tolist(),
                    self.country_currency,
                    self.country_year.tolist(),
                    strict=True,
                )
            )
        ]
        texts["org"] = [
            f"{org[i]} is {_a(_ORG_KINDS[k][1])} founded in {y} by {person[f]}. Its headquarters are in {city[hc]}."
            for i, (k, y, f, hc) in enumerate(
                zip(
                    self.org_kind.tolist(),
                    self.org_year.tolist(),
                    self.org_founder.tolist(),
                    self.org_city.tolist(),
                    strict=True,
                )
            )
        ]
        texts["work"] = [
            f"{nm['work'][i]} is {_a(_GENRES[g])} published in {y} by {org[p]}. It was written by {person[a]}."
            for i, (g, y, p, a) in enumerate(
                zip(
                    self.work_genre.tolist(),
                    self.work_year.tolist(),
                    self.work_publisher.tolist(),
                    self.work_author.tolist(),
                    strict=True,
                )
            )
        ]
        return texts

    def _referrers(self) -> None:
        """For each entity, the passages (type, index) that name it other than its own."""
        refs: dict[tuple[str, int], list[tuple[str, int]]] = {}

        def add(target: tuple[str, int], source: tuple[str, int]) -> None:
            refs.setdefault(target, []).append(source)

        for i, (pc, po, m) in enumerate(
            zip(
                self.person_city.tolist(),
                self.person_org.tolist(),
                self.person_mentor.tolist(),
                strict=True,
            )
        ):
            add(("city", pc), ("person", i))
            add(("org", po), ("person", i))
            if m >= 0:
                add(("person", m), ("person", i))
        for i, k in enumerate(self.city_country.tolist()):
            add(("country", k), ("city", i))
        for i, cap in enumerate(self.country_capital.tolist()):
            add(("city", cap), ("country", i))
        for i, (hc, f) in enumerate(
            zip(self.org_city.tolist(), self.org_founder.tolist(), strict=True)
        ):
            add(("city", hc), ("org", i))
            add(("person", f), ("org", i))
        for i, (a, p) in enumerate(
            zip(self.work_author.tolist(), self.work_publisher.tolist(), strict=True)
        ):
            add(("person", a), ("work", i))
            add(("org", p), ("work", i))
        self.refs = refs
        self.texts = self._texts()

    def _naming(self, ent: tuple[str, int]) -> list[tuple[str, int]]:
        return [ent, *self.refs.get(ent, [])]

    # -- questions --
    def _questions(self) -> tuple[dict[str, list[dict[str, Any]]], set[tuple[str, int]]]:
        cfg, rng = self.cfg, self.rng
        removed: set[tuple[str, int]] = set()
        protected: set[tuple[str, int]] = set()
        seen_text: set[str] = set()
        per_split = dict(zip(SPLITS, cfg.n_questions, strict=True))
        n_unans = {s: round(cfg.unanswerable_rate * n) for s, n in per_split.items()}
        out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
        # unanswerable questions first: each removes one passage no other question needs
        for split in SPLITS:
            while len(out[split]) < n_unans[split]:
                q = self._chain_question(rng.choice(cfg.hops), removed, seen_text)
                if q is None:
                    continue
                hop = int(rng.integers(1, len(q["chain"])))  # hop 2 or later
                victim = q["chain"][hop]
                if victim in protected:
                    continue
                q["missing"] = victim
                removed.add(victim)
                protected.update(e for e in q["chain"] if e != victim)
                seen_text.add(q["question"])
                out[split].append(q)
        for split in SPLITS:
            while len(out[split]) < per_split[split]:
                if rng.random() < cfg.comparison_rate:
                    q = self._comparison_question(removed, seen_text)
                else:
                    q = self._chain_question(rng.choice(cfg.hops), removed, seen_text)
                if q is None:
                    continue
                protected.update(q["chain"])
                seen_text.add(q["question"])
                out[split].append(q)
        for split in SPLITS:
            order = rng.permutation(len(out[split]))
            out[split] = [out[split][i] for i in order.tolist()]
        return out, removed

    def _mentions(self, ent: tuple[str, int], value: str) -> bool:
        pattern = re.compile(rf"(?<!\w){re.escape(value)}(?!\w)")
        return any(pattern.search(self.texts[t][i]) for t, i in self._naming(ent))

    def _chain_question(self, hops: int, removed: set, seen: set) -> dict[str, Any] | None:
        rng = self.rng
        hops = int(hops)
        start_type = str(
            rng.choice(["work", "person", "org", "city", "country"], p=[0.3, 0.3, 0.2, 0.15, 0.05])
        )
        start = (start_type, int(rng.integers(0, self.counts[start_type])))
        if start in removed:
            return None
        chain = [start]
        rels: list[str] = []
        cur = start
        answer = ""
        for h in range(hops):
            edges = self._edges(*cur)
            last = h == hops - 1
            options = [r for r, v in edges.items() if isinstance(v, tuple) or last]
            rel = options[int(rng.integers(0, len(options)))]
            val = edges[rel]
            rels.append(rel)
            if isinstance(val, tuple) and (val in chain or val in removed):
                return None
            if last:
                answer = self.names[val[0]][val[1]] if isinstance(val, tuple) else val
            else:
                assert isinstance(val, tuple)
                chain.append(val)
                cur = val
        # a chain must not end on an entity that is itself on the chain, nor be answerable from
        # any passage naming the start entity
        if self._mentions(start, answer):
            return None
        phrase = self.names[start[0]][start[1]]
        for rel in rels[:-1]:
            phrase = RELATIONS[rel][2].format(X=phrase)
        question = RELATIONS[rels[-1]][3].format(X=phrase)
        if question in seen:
            return None
        decomposition = []
        for ent, rel in zip(chain, rels, strict=True):
            sub_answer = self._value(ent, rel)
            decomposition.append(
                {
                    "question": RELATIONS[rel][3].format(X=self.names[ent[0]][ent[1]]),
                    "answer": sub_answer,
                    "passage_id": self.ids[ent[0]][ent[1]],
                }
            )
        return {
            "question": question,
            "answer": answer,
            "chain": chain,
            "type": "compositional",
            "start": self.names[start[0]][start[1]],
            "relations": rels,
            "decomposition": decomposition,
            "missing": None,
        }

    def _value(self, ent: tuple[str, int], rel: str) -> str:
        val = self._edges(*ent)[rel]
        return self.names[val[0]][val[1]] if isinstance(val, tuple) else str(val)

    def _comparison_question(self, removed: set, seen: set) -> dict[str, Any] | None:
        rng = self.rng
        etype = str(rng.choice(list(_COMPARISONS)))
        attr, template = _COMPARISONS[etype]
        a, b = (int(x) for x in rng.integers(0, self.counts[etype], size=2))
        ea, eb = (etype, a), (etype, b)
        if a == b or ea in removed or eb in removed:
            return None
        va, vb = int(self._value(ea, attr)), int(self._value(eb, attr))
        if va == vb:
            return None
        if set(self._naming(ea)) & set(self._naming(eb)):
            return None
        na, nb = self.names[etype][a], self.names[etype][b]
        question = template.format(A=na, B=nb)
        if question in seen:
            return None
        answer = na if va < vb else nb
        decomposition = [
            {
                "question": RELATIONS[attr][3].format(X=n),
                "answer": str(v),
                "passage_id": self.ids[etype][i],
            }
            for n, v, i in ((na, va, a), (nb, vb, b))
        ]
        return {
            "question": question,
            "answer": answer,
            "chain": [ea, eb],
            "type": "comparison",
            "start": na,
            "other": nb,
            "relations": [attr, attr],
            "decomposition": decomposition,
            "missing": None,
        }

    # -- corpus and pools --
    def _corpus(self, removed: set[tuple[str, int]]) -> Corpus:
        ids: list[str] = []
        titles: list[str] = []
        texts: list[str] = []
        for t in _TYPES:
            drop = {i for tt, i in removed if tt == t}
            if drop:
                keep = [i for i in range(self.counts[t]) if i not in drop]
                ids += [self.ids[t][i] for i in keep]
                titles += [self.names[t][i] for i in keep]
                texts += [self.texts[t][i] for i in keep]
            else:
                ids += self.ids[t]
                titles += self.names[t]
                texts += self.texts[t]
        return Corpus.from_columns(
            ids, titles, texts, name=f"synthhop-{self.cfg.seed}-{self.cfg.n_passages}"
        )

    def _family(self, ent: tuple[str, int], limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` same-type entities that share a name part (surname, suffix, noun) or
        a country with ``ent``, in random order."""
        etype, i = ent
        if not hasattr(self, "_families"):
            fam: dict[tuple[str, int], list[int]] = {}
            for t, keys in (
                ("person", self.person_last),
                ("org", self.org_kind),
                ("work", self.work_noun),
                ("city", self.city_country),
            ):
                for j, key in enumerate(keys.tolist()):
                    fam.setdefault((t, key), []).append(j)
            fam[("country", 0)] = list(range(self.counts["country"]))
            self._families = fam
            self._family_key = {
                "person": self.person_last,
                "org": self.org_kind,
                "work": self.work_noun,
                "city": self.city_country,
            }
        key = int(self._family_key[etype][i]) if etype in self._family_key else 0
        members = self._families[(etype, key)]
        if len(members) > limit + 1:
            picks = self.rng.choice(len(members), size=limit + 1, replace=False).tolist()
        else:
            picks = self.rng.permutation(len(members)).tolist()
        return [(etype, members[p]) for p in picks if members[p] != i][:limit]

    def _pools(
        self, questions: dict[str, list[dict[str, Any]]], removed: set, corpus: Corpus
    ) -> None:
        rng, size = self.rng, self.cfg.pool_size
        for qs in questions.values():
            for q in qs:
                gold = [e for e in q["chain"] if e not in removed]
                pool: list[tuple[str, int]] = list(gold)
                taken = set(pool)
                candidates = [self._family(e, 4 * size) for e in q["chain"]]
                # round-robin over the gold entities' families, then random same-type entities
                while len(pool) < size and any(candidates):
                    for cands in candidates:
                        while cands:
                            e = cands.pop()
                            if e not in taken and e not in removed:
                                pool.append(e)
                                taken.add(e)
                                break
                        if len(pool) >= size:
                            break
                while len(pool) < size:
                    t = q["chain"][int(rng.integers(0, len(q["chain"])))][0]
                    e = (t, int(rng.integers(0, self.counts[t])))
                    if e not in taken and e not in removed:
                        pool.append(e)
                        taken.add(e)
                order = rng.permutation(len(pool)).tolist()
                q["pool"] = [pool[j] for j in order]

    def _example(self, q: dict[str, Any], corpus: Corpus) -> QAExample:
        ids = self.ids
        gold = tuple(ids[t][i] for t, i in q["chain"] if (t, i) != q["missing"])
        passages = tuple(corpus[ids[t][i]] for t, i in q["pool"])
        qid = f"synthhop-{self.cfg.seed}-{abs(hash_text(q['question'])) % 10**10:010d}"
        meta: dict[str, Any] = {
            "decomposition": q["decomposition"],
            "relations": q["relations"],
            "start_entity": q["start"],
        }
        if "other" in q:
            meta["other_entity"] = q["other"]
        if q["missing"] is not None:
            meta["missing_id"] = ids[q["missing"][0]][q["missing"][1]]
        return QAExample(
            id=qid,
            question=q["question"],
            answers=(q["answer"],),
            supporting_ids=gold,
            passages=passages,
            hops=len(q["decomposition"]),
            answerable=q["missing"] is None,
            type=q["type"],
            meta=meta,
        )


def hash_text(text: str) -> int:
    """A stable (not salted) 64-bit hash of ``text``."""
    import hashlib

    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=8).digest(), "big", signed=True
    )

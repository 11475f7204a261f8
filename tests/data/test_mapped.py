"""A MappedCorpus answers exactly as the in-memory Corpus it was written from (issue 20: serve
from a memory-mapped index), and refuses a damaged map or line with an error naming the file."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from rag_gym.data import Corpus, Passage
from rag_gym.data.mapped import CORPUS_MAP, MappedCorpus, write_corpus_files
from rag_gym.retrieval.base import id_ranks, positions

# ids chosen to sort differently as bytes, as numbers and by length; one non-ASCII title and id
PASSAGES = [
    Passage("10", "Ten", "the tenth"),
    Passage("9", "Nine", 'has "quotes" and a \\ backslash'),
    Passage("a", "", "no title"),
    Passage("ä-umlaut", "Zürich", "non-ASCII text: naïve café"),
    Passage("A", "Upper", "upper-case id"),
    Passage("a0", "Ten", "an id that extends another"),
]


@pytest.fixture
def pair(tmp_path):
    corpus = Corpus(PASSAGES, name="demo")
    facts = write_corpus_files(corpus, tmp_path)
    return corpus, MappedCorpus(tmp_path, name="demo", size=len(corpus)), facts


def test_answers_as_the_in_memory_corpus(pair):
    corpus, mapped, facts = pair
    assert len(mapped) == len(corpus) == facts["size"]
    assert list(mapped.ids) == corpus.ids
    assert list(mapped.titles) == corpus.titles and list(mapped.texts) == corpus.texts
    assert mapped.ids == corpus.ids and mapped.ids[-1] == "a0" and mapped.ids[1:3] == ["9", "a"]
    assert list(mapped) == list(corpus)
    assert mapped.contents() == corpus.contents()
    assert mapped.checksum() == corpus.checksum() == facts["checksum"]
    for pid in corpus.ids:
        assert mapped[pid] == corpus[pid] and mapped.position(pid) == corpus.position(pid)
        assert pid in mapped
    for missing in ("", "b", "1", "a00", "ä", 10, None):
        assert missing not in mapped
    with pytest.raises(KeyError, match="no passage with id 'b'"):
        mapped["b"]
    assert mapped.get("b") is None
    # the tie-break order and pool positions retrievers use
    assert mapped.id_rank.tolist() == id_ranks(corpus).tolist() == facts["id_rank"].tolist()
    assert id_ranks(mapped).tolist() == id_ranks(corpus).tolist()
    pool = ["a0", "9", "9", "A"]
    assert positions(mapped, pool).tolist() == positions(corpus, pool).tolist()
    assert positions(mapped, ["nope", "a"], strict=False).tolist() == [2]
    assert mapped.ids_at(np.array([5, 0])) == corpus.ids_at([5, 0]) == ["a0", "10"]


def test_ids_a_retriever_returned_are_found_by_id_from_memory_and_the_memory_is_bounded(
    pair, monkeypatch
):
    import rag_gym.data.mapped as mapped_module

    corpus, mapped, _ = pair
    monkeypatch.setattr(mapped_module, "_RECENT_IDS", 3)
    monkeypatch.setattr(mapped_module, "_RECENT_ROWS", 2)
    assert mapped.ids_at([5, 3, 1]) == ["a0", "ä-umlaut", "9"]
    assert mapped._recent == {"a0": 5, "ä-umlaut": 3, "9": 1}
    # found without the binary search: break it, and the remembered ids still resolve
    monkeypatch.setattr(mapped_module.bisect, "bisect_left", None)
    for pid in ("a0", "ä-umlaut", "9"):
        assert mapped.position(pid) == corpus.position(pid)
        assert mapped[pid] == corpus[pid]
    monkeypatch.undo()
    monkeypatch.setattr(mapped_module, "_RECENT_IDS", 3)
    monkeypatch.setattr(mapped_module, "_RECENT_ROWS", 2)
    assert mapped.ids_at([0]) == ["10"]  # full: emptied, then this one remembered
    assert mapped._recent == {"10": 0}
    for pid in corpus.ids:  # rows read through a memory of two, always the right row
        assert mapped[pid] == corpus[pid]
        assert len(mapped._rows) <= 2


def test_read_only_and_picklable(pair):
    _, mapped, _ = pair
    with pytest.raises(TypeError, match="read-only"):
        mapped.add(Passage("z", "", "z"))
    again = pickle.loads(pickle.dumps(mapped))
    assert list(again) == list(mapped) and again.name == "demo"


def test_duplicate_or_nul_ids_are_refused_at_write(tmp_path):
    with pytest.raises(ValueError, match="the id 'x' appears more than once"):
        write_corpus_files(
            [Passage("y", "", "1"), Passage("x", "", "2"), Passage("x", "", "3")], tmp_path
        )
    with pytest.raises(ValueError, match="holds a NUL byte"):
        write_corpus_files([Passage("ok", "", "1"), Passage("b\x00d", "", "2")], tmp_path)


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("offsets.npy", lambda a: a[:-1], "offsets.npy and id_ptr.npy must have"),
        ("offsets.npy", lambda a: a + 1, "does not cut corpus.jsonl"),
        ("id_ptr.npy", lambda a: np.concatenate([a[:1], a[1:] - 1]), "does not cut ids.npy"),
        ("by_id.npy", lambda a: a + 100, "outside"),
        ("crc.npy", lambda a: a.astype(np.int64), "uint32"),
    ],
)
def test_a_damaged_map_is_refused_naming_it(pair, tmp_path, name, damage, message):
    path = tmp_path / CORPUS_MAP / name
    np.save(path, damage(np.load(path)))
    with pytest.raises(ValueError, match=rf"{CORPUS_MAP}: .*{message}.*rebuild the index"):
        MappedCorpus(tmp_path, size=len(PASSAGES))


def test_a_size_other_than_the_index_is_refused(pair, tmp_path):
    with pytest.raises(ValueError, match="it maps 6 passages, the index has 7"):
        MappedCorpus(tmp_path, size=7)


def test_a_damaged_line_is_refused_when_read(pair, tmp_path):
    corpus, _, _ = pair
    path = tmp_path / "corpus.jsonl"
    raw = bytearray(path.read_bytes())
    at = raw.index(b"tenth")
    raw[at] ^= 0x20  # "Tenth": same length, valid JSON, another text
    path.write_bytes(bytes(raw))
    mapped = MappedCorpus(tmp_path, size=len(corpus))
    assert mapped["9"] == corpus["9"]
    with pytest.raises(ValueError, match=r"corpus\.jsonl line 1 is damaged \(its CRC-32"):
        mapped["10"]
    with pytest.raises(ValueError, match="line 1 is damaged"):
        mapped.checksum()


def test_an_id_that_disagrees_with_the_map_is_refused(pair, tmp_path):
    corpus, _, _ = pair
    ids = tmp_path / CORPUS_MAP / "ids.npy"
    blob = np.load(ids)
    blob[0] = ord("2")  # "10" -> "20" in the map, the line still says "10"
    np.save(ids, blob)
    mapped = MappedCorpus(tmp_path, size=len(corpus))
    with pytest.raises(ValueError, match=r"its id '10' is not corpus_map/ids\.npy's '20'"):
        mapped.texts[0]

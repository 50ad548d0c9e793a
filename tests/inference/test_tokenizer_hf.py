"""The HF implementation and the built-in tokenizer written out as an HF directory."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hermes_async.errors import ConfigError
from hermes_async.inference import hf
from hermes_async.inference.hf import HFTokenizer, default_tokenizer_cache_dir, qwen_offline_hf_dir
from hermes_async.inference.tokenizer import QwenTokenizer, Tokenizer, load_tokenizer
from tests.inference.test_tokenizer import CONVERSATION, CORPUS, TOOLS

pytest.importorskip("transformers")

QWEN = QwenTokenizer()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen_offline_hf_dir(tmp_path_factory.mktemp("tok") / "qwen-offline")


@pytest.fixture(scope="module")
def hf_tok(hf_dir: Path) -> HFTokenizer:
    tok = load_tokenizer(str(hf_dir))
    assert isinstance(tok, HFTokenizer)
    return tok


def test_directory_layout_and_config(hf_dir: Path) -> None:
    names = {p.name for p in hf_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "<|endoftext|>"
    assert "<tool_call>" in config["chat_template"]
    assert not [p for p in hf_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_autotokenizer_loads_the_directory_directly(hf_dir: Path) -> None:
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(hf_dir))
    assert auto.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False) == [
        151644,
        872,
        198,
        6023,
        151645,
    ]
    assert len(auto) == 151669
    # Qwen's flags: <tool_call> & co. are added but not "special" (kept by skip_special_tokens).
    assert auto.decode([151657, 151645], skip_special_tokens=True) == "<tool_call>"


def test_protocol_properties_match(hf_tok: HFTokenizer) -> None:
    assert isinstance(hf_tok, Tokenizer)
    assert hf_tok.eos_token_id == QWEN.eos_token_id == 151645
    assert len(hf_tok) == len(QWEN)
    assert hf_tok.special_tokens == QWEN.special_tokens


@pytest.mark.parametrize("text", CORPUS)
def test_identical_ids_on_the_corpus(hf_tok: HFTokenizer, text: str) -> None:
    ids = QWEN.encode(text)
    assert hf_tok.encode(text) == ids
    assert hf_tok.encode(text, allow_special=False) == QWEN.encode(text, allow_special=False)
    assert hf_tok.decode(ids) == QWEN.decode(ids)


@settings(max_examples=60, deadline=None)
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40))
def test_identical_ids_on_random_text(hf_tok: HFTokenizer, text: str) -> None:
    assert hf_tok.encode(text) == QWEN.encode(text)


@pytest.mark.parametrize("with_tools", [False, True])
def test_apply_chat_template_renders_the_same_text(hf_tok: HFTokenizer, with_tools: bool) -> None:
    tools = TOOLS if with_tools else None
    for k in range(1, len(CONVERSATION) + 1):
        for gen in (False, True):
            ours = QWEN.apply_chat_template(CONVERSATION[:k], tools, add_generation_prompt=gen)
            theirs = hf_tok.apply_chat_template(CONVERSATION[:k], tools, add_generation_prompt=gen)
            assert theirs == ours, (k, gen)


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.one_of(st.integers(0, 151668), st.integers(0, 255)), max_size=30),
    data=st.data(),
)
def test_hf_incremental_decoder_equals_full_decode(
    hf_tok: HFTokenizer, ids: list[int], data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids) + 1)))
    decoder = hf_tok.incremental_decoder()
    pieces = []
    start = 0
    for cut in [*cuts, len(ids)]:
        pieces.append(decoder.decode(ids[start:cut]))
        start = cut
    pieces.append(decoder.flush())
    assert "".join(pieces) == hf_tok.decode(ids) == QWEN.decode(ids)


def test_hf_incremental_decoder_emits_a_split_character_once(hf_tok: HFTokenizer) -> None:
    ids = QWEN.encode("a𓀀b")
    decoder = hf_tok.incremental_decoder()
    pieces = [decoder.decode([i]) for i in ids]
    assert "𓀀" in pieces
    assert "".join(pieces) + decoder.flush() == "a𓀀b"


def test_cached_directory_is_reused_and_stale_one_rebuilt(hf_dir: Path) -> None:
    stamp = hf_dir / "hermes_async_tokenizer.json"
    before = (hf_dir / "tokenizer.json").stat().st_mtime_ns
    started = time.perf_counter()
    assert qwen_offline_hf_dir(hf_dir) == hf_dir
    assert time.perf_counter() - started < 1.0  # no rebuild
    assert (hf_dir / "tokenizer.json").stat().st_mtime_ns == before
    stamp.write_text('{"fingerprint": "old"}')
    assert qwen_offline_hf_dir(hf_dir) == hf_dir
    assert json.loads(stamp.read_text())["fingerprint"] != "old"
    assert not [p for p in hf_dir.parent.iterdir() if p.name.startswith(".")]


def test_default_cache_dir_honours_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HERMES_ASYNC_CACHE_DIR", str(tmp_path / "c"))
    assert default_tokenizer_cache_dir() == tmp_path / "c" / "tokenizers"
    monkeypatch.delenv("HERMES_ASYNC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_tokenizer_cache_dir() == tmp_path / "x" / "hermes_async" / "tokenizers"


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer directory .*nope.* does not exist"):
        load_tokenizer(str(tmp_path / "nope"))


def test_directory_without_tokenizer_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"holds no tokenizer.json or tokenizer_config.json"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ConfigError, match=r"cannot load tokenizer .*'qwen-offline'"):
        load_tokenizer(str(tmp_path))


def test_hub_name_offline_fails_fast_with_advice() -> None:
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by tests/conftest.py
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"HF_HUB_OFFLINE=1 is set.*local tokenizer directory"):
        load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct-does-not-exist")
    assert time.perf_counter() - started < 30


def test_missing_transformers_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, hf_dir: Path
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match=r"install the 'atropos' extra"):
        HFTokenizer.from_pretrained(hf_dir)
    with pytest.raises(ConfigError, match=r"install the 'atropos' extra"):
        hf.qwen_offline_hf_dir(hf_dir.parent / "other")


def test_tokenizer_without_chat_template_is_a_clear_error(hf_tok: HFTokenizer) -> None:
    from transformers import PreTrainedTokenizerFast

    bare = HFTokenizer(
        PreTrainedTokenizerFast(tokenizer_object=hf_tok.hf_tokenizer.backend_tokenizer),
        name="bare",
        eos_token_id=0,
    )
    with pytest.raises(ConfigError, match="'bare' has no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])

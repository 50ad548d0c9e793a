"""HF ``transformers`` tokenizers, and the built-in Qwen tokenizer as an HF directory.

``transformers`` (the ``atropos`` extra) loads lazily. Everything blocks: call it at setup
time. Without ``HF_HUB_OFFLINE=1`` a hub name missing from the cache retries for ~45 s, so
pass a local directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_async.errors import ConfigError
from hermes_async.inference._chat_template import default_chat_template
from hermes_async.inference._qwen import (
    QWEN_ADDED_TOKENS,
    QWEN_FIRST_ADDED_ID,
    QWEN_NON_SPECIAL_ADDED_TOKENS,
    QWEN_OFFLINE_NAME,
    QWEN_PATTERN,
    qwen_bpe_path,
)
from hermes_async.inference._tokenizer_base import IncrementalDecoder, RenderRequest, TokenizerBase

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = (
    "HFTokenizer",
    "default_tokenizer_cache_dir",
    "qwen_offline_hf_dir",
)

_EXTRA_HINT = "install the 'atropos' extra: pip install 'hermes-async[atropos]'"
#: File in a written tokenizer directory that records what it was built from.
_STAMP_FILE = "hermes_async_tokenizer.json"
#: Bump when the way the directory is built changes (invalidates cached directories).
_BUILD_FORMAT = 1


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ConfigError(f"HF tokenizers need the 'transformers' package; {_EXTRA_HINT}") from exc
    return transformers


class _WindowIncrementalDecoder:
    """Incremental decoder for any HF tokenizer (the prefix/read-offset method).

    Decodes the window of ids since the last complete character with and without the new
    ids and emits the difference; waits while the text ends in U+FFFD (an incomplete
    sequence). A window, not single tokens, keeps SentencePiece's word-start spaces right.
    """

    __slots__ = ("_decode", "_ids", "_prefix", "_read")

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def decode(self, token_ids: Sequence[int]) -> str:
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            # Drop ids already emitted so memory stays proportional to the window.
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._ids.clear()
        self._prefix = self._read = 0
        return after[len(before) :]


class HFTokenizer(TokenizerBase):
    """A ``transformers`` tokenizer behind the :class:`Tokenizer` protocol.

    Encoding adds no BOS/EOS (the template renders them); decoding keeps special tokens and
    spaces, so the text is exactly what the ids spell. ``eos_token_id`` defaults to
    ``<|im_end|>`` when the chat template uses it, else the tokenizer's.

    Raises:
        ConfigError: No end-of-turn id can be determined.
    """

    __slots__ = ("_tokenizer",)

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str | None = None,
        eos_token_id: int | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        name = name if name is not None else str(tokenizer.name_or_path)
        if eos_token_id is None:
            template = tokenizer.chat_template
            im_end = tokenizer.get_added_vocab().get("<|im_end|>")
            if im_end is not None and isinstance(template, str) and "<|im_end|>" in template:
                eos_token_id = int(im_end)
            elif tokenizer.eos_token_id is not None:
                eos_token_id = int(tokenizer.eos_token_id)
            else:
                raise ConfigError(
                    f"tokenizer {name!r} has no eos_token_id and no <|im_end|> token; "
                    "pass eos_token_id= explicitly"
                )
        super().__init__(name, eos_token_id)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike[str]) -> HFTokenizer:
        """Load with ``AutoTokenizer.from_pretrained`` (blocking; call at setup time).

        Raises:
            ConfigError: ``transformers`` is missing (the ``atropos`` extra), the path does not
                exist, or loading failed.
        """
        transformers = _import_transformers()
        text = os.fspath(name_or_path)
        path = Path(text).expanduser()
        looks_local = path.is_absolute() or text.startswith((".", "~")) or path.exists()
        if looks_local and not path.is_dir():
            raise ConfigError(
                f"tokenizer directory {text!r} does not exist; pass a directory holding "
                f"tokenizer.json / tokenizer_config.json, or {QWEN_OFFLINE_NAME!r}"
            )
        if looks_local and not any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")
        ):
            raise ConfigError(
                f"{text!r} holds no tokenizer.json or tokenizer_config.json; pass a tokenizer "
                f"directory (AutoTokenizer.save_pretrained output), or {QWEN_OFFLINE_NAME!r}"
            )
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(path) if looks_local else text
            )
        except Exception as exc:  # transformers and tokenizers raise many types here
            offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}
            where = (
                "the directory's files"
                if looks_local
                else (
                    "the HF hub (HF_HUB_OFFLINE=1 is set: only names already in the local HF "
                    "cache work)"
                    if offline
                    else "the HF hub"
                )
            )
            detail = " ".join(str(exc).split()).rstrip(".")
            raise ConfigError(
                f"cannot load tokenizer {text!r} from {where}: {detail}. Pass a local tokenizer "
                f"directory, or use the built-in {QWEN_OFFLINE_NAME!r} (an HF copy of it: "
                "hermes_async.inference.hf.qwen_offline_hf_dir())"
            ) from exc
        return cls(tokenizer, name=text)

    @property
    def hf_tokenizer(self) -> PreTrainedTokenizerBase:
        """The wrapped ``transformers`` tokenizer."""
        return self._tokenizer

    @property
    def chat_template_source(self) -> str | None:
        """The tokenizer's chat template source (``None``: none, or several named ones)."""
        template = self._tokenizer.chat_template
        return template if isinstance(template, str) else None

    @property
    def special_tokens(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self._tokenizer.get_added_vocab().items()}

    def __len__(self) -> int:
        return len(self._tokenizer)

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added).

        Without ``allow_special``, every added token's text is spelled in ordinary tokens, even
        ones HF marks non-special (Qwen's ``<tool_call>``): the text skips added-token matching.
        """
        if not allow_special:
            backend = getattr(self._tokenizer, "backend_tokenizer", None)
            if backend is not None:
                if backend.normalizer is not None:
                    text = backend.normalizer.normalize_str(text)
                pieces = (
                    [piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
                    if backend.pre_tokenizer is not None
                    else [text]
                )
                return [int(t.id) for piece in pieces for t in backend.model.tokenize(piece)]
        ids = self._tokenizer.encode(
            text, add_special_tokens=False, split_special_tokens=not allow_special
        )
        return [int(i) for i in ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(
            self._tokenizer.decode(
                list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    def incremental_decoder(self) -> IncrementalDecoder:
        return _WindowIncrementalDecoder(self.decode)

    def _render(self, request: RenderRequest) -> str:
        """Render with the tokenizer's own chat template; ``request.variables`` are keyword arguments."""
        if not self._tokenizer.chat_template:
            raise ConfigError(
                f"tokenizer {self._name!r} has no chat template; use a tokenizer directory "
                f"with one, or the built-in {QWEN_OFFLINE_NAME!r}"
            )
        text = self._tokenizer.apply_chat_template(
            request.messages,
            # (transformers types it list[dict | Callable])
            tools=list(request.tools) if request.tools else None,
            tokenize=False,
            add_generation_prompt=request.generation,
            **request.variables,
        )
        return str(text)


def default_tokenizer_cache_dir() -> Path:
    """The tokenizer cache: ``$HERMES_ASYNC_CACHE_DIR/tokenizers``, else under XDG's cache."""
    root = os.environ.get("HERMES_ASYNC_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "tokenizers"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "hermes_async" / "tokenizers"


def _fingerprint() -> str:
    digest = hashlib.sha256()
    bpe = qwen_bpe_path()
    for part in (
        str(_BUILD_FORMAT),
        QWEN_PATTERN,
        "\n".join(QWEN_ADDED_TOKENS),
        str(bpe.stat().st_size),
        default_chat_template(),
    ):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _is_current(directory: Path, fingerprint: str) -> bool:
    try:
        stamp = json.loads((directory / _STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("fingerprint") == fingerprint


def _build_qwen_hf_tokenizer() -> Any:
    transformers = _import_transformers()
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(vocab_file=str(qwen_bpe_path()), pattern=QWEN_PATTERN)  # type: ignore[no-untyped-call]
    backend = converter.converted()
    backend.normalizer = normalizers.NFC()
    for index, token in enumerate(QWEN_ADDED_TOKENS):
        added = AddedToken(
            token,
            special=token not in QWEN_NON_SPECIAL_ADDED_TOKENS,
            normalized=False,
            lstrip=False,
            rstrip=False,
            single_word=False,
        )
        # One at a time, so ids follow QWEN_ADDED_TOKENS' order.
        if added.special:
            backend.add_special_tokens([added])
        else:
            backend.add_tokens([added])
        if backend.token_to_id(token) != QWEN_FIRST_ADDED_ID + index:
            raise ConfigError(
                f"building the Qwen HF tokenizer gave {token!r} id {backend.token_to_id(token)}, "
                f"expected {QWEN_FIRST_ADDED_ID + index}; report this with your tokenizers version"
            )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=default_chat_template(),
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
        split_special_tokens=False,
    )


def _save_tokenizer_dir(
    target: Path, tokenizer: Any, files: Mapping[str, str], is_current: Callable[[], bool]
) -> None:
    """Save ``tokenizer`` and ``files`` (the stamp last) as the directory ``target``, atomically.

    On a lost race, ``is_current()`` says whether the winner's build will do.

    Raises:
        ConfigError: The cache directory cannot be created.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as exc:
        raise ConfigError(
            f"cannot create the tokenizer cache directory {target.parent}: {exc}; set "
            "HERMES_ASYNC_CACHE_DIR to a writable directory or pass directory="
        ) from exc
    try:
        tokenizer.save_pretrained(str(tmp), save_jinja_files=False)
        tmp.chmod(0o755)  # mkdtemp made it private; the cache is meant to be readable
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if target.exists():
            # Stale build: move it aside first (rename is atomic), then delete it.
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale.", dir=target.parent))
            with contextlib.suppress(FileNotFoundError):  # another process moved it already
                target.rename(stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:
            # Lost a race: another process renamed its build into place between our checks.
            if not is_current():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def qwen_offline_hf_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """The built-in Qwen tokenizer as an HF tokenizer directory, built on first use (~3-4 s).

    It loads with ``AutoTokenizer``, as atroposlib's ``tokenizer_name`` and vLLM's
    ``--tokenizer``. Reused while its stamp matches; written atomically.

    Raises:
        ConfigError: ``transformers`` is missing (the ``atropos`` extra) or the directory
            cannot be written.
    """
    target = (
        Path(directory).expanduser()
        if directory is not None
        else default_tokenizer_cache_dir() / QWEN_OFFLINE_NAME
    )
    fingerprint = _fingerprint()
    if _is_current(target, fingerprint):
        return target
    tokenizer = _build_qwen_hf_tokenizer()
    stamp = json.dumps({"fingerprint": fingerprint, "built_by": "hermes_async"}) + "\n"
    _save_tokenizer_dir(
        target, tokenizer, {_STAMP_FILE: stamp}, lambda: _is_current(target, fingerprint)
    )
    return target

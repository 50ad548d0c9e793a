"""Model families end to end: an offline tokenizer directory per family.

Each holds the family's chat template, end-of-turn tokens and parser. Blocking: call it at
setup time. The family table and template caveats: docs/architecture.md, "Model families".
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from hermes_async._exports import fixup_module_metadata
from hermes_async.errors import ConfigError
from hermes_async.inference._chat_template import default_chat_template, render_chat_template
from hermes_async.inference._tokenizer_base import RenderRequest
from hermes_async.inference.families._build import build_backend
from hermes_async.inference.hf import (
    HFTokenizer,
    _import_transformers,
    _save_tokenizer_dir,
    default_tokenizer_cache_dir,
)
from hermes_async.jsontypes import JSON, JSONObject

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = (
    "FAMILIES",
    "FAMILY_STAMP_FILE",
    "FamilyTokenizer",
    "ModelFamily",
    "family",
    "family_tokenizer_dir",
    "is_family_dir",
    "load_family_tokenizer",
)

#: The stamp a family directory carries (what it was built from, its end-of-turn tokens).
FAMILY_STAMP_FILE = "hermes_async_family.json"
#: Bump when the way directories are built changes (invalidates cached ones).
_BUILD_FORMAT = 1


@dataclass(frozen=True, slots=True)
class ModelFamily:
    """One model family's tokenizer layout.

    Attributes:
        vocab: ``qwen``, ``deepseek`` (real vocabularies) or ``bpe`` (a small trained one).
        template: The template file in ``families/templates`` (``None``: built-in ChatML).
        end_of_turn: The tokens that end a model turn; the first becomes ``eos_token``.
        arguments_as_objects: The template iterates over arguments (GLM), so argument
            strings are decoded before rendering.
    """

    name: str
    parser: str
    vocab: str
    template: str | None
    end_of_turn: tuple[str, ...]
    specials: tuple[str, ...]
    bos: str | None = None
    arguments_as_objects: bool = False
    variables: Mapping[str, JSON] = field(default_factory=dict)

    def chat_template(self) -> str:
        """The Jinja source of this family's template."""
        if self.template is None:
            return default_chat_template()
        return (
            resources.files("hermes_async.inference.families")
            .joinpath("templates", self.template)
            .read_text(encoding="utf-8")
        )


_QWEN_SPECIALS = (
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
)
_DEEPSEEK_SPECIALS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<think>",
    "</think>",
)

#: The families, by name.
FAMILIES: Mapping[str, ModelFamily] = {
    f.name: f
    for f in (
        ModelFamily("hermes", "hermes", "qwen", None, ("<|im_end|>",), _QWEN_SPECIALS),
        ModelFamily("qwen3", "hermes", "qwen", "qwen3.jinja", ("<|im_end|>",), _QWEN_SPECIALS),
        ModelFamily(
            "llama3",
            "llama3_json",
            "bpe",
            "llama3.jinja",
            ("<|eot_id|>", "<|eom_id|>"),
            (
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
            ),
            bos="<|begin_of_text|>",
        ),
        ModelFamily(
            "mistral_v11",
            "mistral",
            "bpe",
            "mistral_v11.jinja",
            ("</s>",),
            (
                "<unk>",
                "<s>",
                "</s>",
                "[INST]",
                "[/INST]",
                "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]",
                "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]",
                "[TOOL_CALLS]",
                "[SYSTEM_PROMPT]",
                "[/SYSTEM_PROMPT]",
                "[ARGS]",
                "[CALL_ID]",
            ),
            bos="<s>",
        ),
        ModelFamily(
            "deepseek_v3",
            "deepseek_v3",
            "deepseek",
            "deepseek_v3.jinja",
            ("<｜end▁of▁sentence｜>",),
            _DEEPSEEK_SPECIALS,
            bos="<｜begin▁of▁sentence｜>",
        ),
        ModelFamily(
            "deepseek_v31",
            "deepseek_v3_1",
            "deepseek",
            "deepseek_v31.jinja",
            ("<｜end▁of▁sentence｜>",),
            _DEEPSEEK_SPECIALS,
            bos="<｜begin▁of▁sentence｜>",
        ),
        ModelFamily(
            "glm45",
            "glm45",
            "bpe",
            "glm45.jinja",
            ("<|user|>", "<|observation|>", "<|endoftext|>"),
            (
                "[gMASK]",
                "<sop>",
                "<|system|>",
                "<|user|>",
                "<|assistant|>",
                "<|observation|>",
                "<|endoftext|>",
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
                "<tool_response>",
                "</tool_response>",
            ),
            arguments_as_objects=True,
        ),
        ModelFamily(
            "kimi_k2",
            "kimi_k2",
            "bpe",
            "kimi_k2.jinja",
            ("<|im_end|>",),
            (
                "<|im_system|>",
                "<|im_user|>",
                "<|im_assistant|>",
                "<|im_middle|>",
                "<|im_end|>",
                "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>",
                "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>",
                "<|tool_call_end|>",
                "[EOS]",
            ),
        ),
    )
}


# The template sources the families ship (read at import: small package files).
_SHIPPED_SOURCES = frozenset(f.chat_template() for f in FAMILIES.values())


def family(name: str) -> ModelFamily:
    """The :class:`ModelFamily` called ``name``.

    Raises:
        ConfigError: An unknown name (the message lists the known ones).
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}"
        ) from None


def _fingerprint(fam: ModelFamily) -> str:
    digest = hashlib.sha256()
    for part in (
        str(_BUILD_FORMAT),
        fam.name,
        fam.vocab,
        "\n".join(fam.specials),
        "\n".join(fam.end_of_turn),
        fam.chat_template(),
    ):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _stamp(directory: Path) -> JSONObject | None:
    try:
        stamp = json.loads((directory / FAMILY_STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def is_family_dir(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` was written by :func:`family_tokenizer_dir` (blocking: one stat)."""
    return (Path(directory).expanduser() / FAMILY_STAMP_FILE).is_file()


def family_tokenizer_dir(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """The tokenizer directory of family ``name``, built offline on first use (blocking).

    Reused while its stamp matches; written atomically. Default location:
    ``default_tokenizer_cache_dir() / "family-<name>"``.

    Raises:
        ConfigError: Unknown family, a missing package (the ``families`` extra), or an
            unwritable directory.
    """
    fam = family(name)
    target = (
        Path(directory).expanduser()
        if directory is not None
        else default_tokenizer_cache_dir() / f"family-{name}"
    )
    fingerprint = _fingerprint(fam)

    def is_current() -> bool:
        current = _stamp(target)
        return current is not None and current.get("fingerprint") == fingerprint

    if is_current():
        return target
    transformers = _import_transformers()
    backend = build_backend(fam.vocab, fam.specials)
    missing = [t for t in fam.specials if backend.token_to_id(t) is None]
    if missing:  # pragma: no cover - build_backend adds them
        raise ConfigError(f"family {name!r}: tokens {missing} missing from the vocabulary")
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=fam.end_of_turn[0],
        bos_token=fam.bos,
        chat_template=fam.chat_template(),
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
        split_special_tokens=False,
    )
    end_ids = [backend.token_to_id(t) for t in fam.end_of_turn]
    stamp = {
        "fingerprint": fingerprint,
        "family": name,
        "parser": fam.parser,
        "end_of_turn": list(fam.end_of_turn),
        "arguments_as_objects": fam.arguments_as_objects,
        "variables": dict(fam.variables),
        "built_by": "hermes_async",
    }
    files = {
        "generation_config.json": json.dumps({"eos_token_id": end_ids}) + "\n",
        FAMILY_STAMP_FILE: json.dumps(stamp) + "\n",
    }
    _save_tokenizer_dir(target, tokenizer, files, is_current)
    return target


def _objects(messages: list[JSONObject]) -> list[JSONObject]:
    """Messages whose tool-call argument strings are decoded (for templates that iterate)."""
    out: list[JSONObject] = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        decoded = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                try:
                    value = json.loads(arguments)
                except ValueError:
                    value = {}
                call = {**call, "function": {**function, "arguments": value}}  # type: ignore[dict-item]
            decoded.append(call)
        out.append({**message, "tool_calls": decoded})
    return out


class FamilyTokenizer(HFTokenizer):
    """An HF tokenizer of a family directory: end-of-turn ids and template variables known.

    Args:
        end_of_turn_ids: The ids that end a model turn (the first is :attr:`eos_token_id`).
        variables: Template variables passed on every rendering (``enable_thinking``...).
        arguments_as_objects: Decode JSON argument strings before rendering.
    """

    __slots__ = ("_end_of_turn_ids", "_objects", "_variables", "family", "parser")

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str,
        end_of_turn_ids: Sequence[int],
        variables: Mapping[str, JSON] | None = None,
        arguments_as_objects: bool = False,
        family: str = "",
        parser: str = "hermes",
    ) -> None:
        if not end_of_turn_ids:
            raise ConfigError(f"tokenizer {name!r}: at least one end-of-turn id is needed")
        super().__init__(tokenizer, name=name, eos_token_id=int(end_of_turn_ids[0]))
        self._end_of_turn_ids = tuple(int(i) for i in end_of_turn_ids)
        self._variables = dict(variables or {})
        self._objects = arguments_as_objects
        self.family = family
        self.parser = parser

    @property
    def end_of_turn_ids(self) -> tuple[int, ...]:
        """Every id that ends a model turn (the agent loop's default stop ids)."""
        return self._end_of_turn_ids

    @property
    def variables(self) -> dict[str, JSON]:
        """The template variables (a copy)."""
        return dict(self._variables)

    @classmethod
    def from_directory(
        cls, directory: str | os.PathLike[str], **variables: JSON
    ) -> FamilyTokenizer:
        """Load a family directory (blocking); ``variables`` override the stamp's.

        Raises:
            ConfigError: Not a family directory, or it cannot be loaded.
        """
        path = Path(directory).expanduser()
        stamp = _stamp(path)
        if stamp is None:
            raise ConfigError(
                f"{str(path)!r} is not a family tokenizer directory (no {FAMILY_STAMP_FILE}); "
                "build one with hermes_async.inference.families.family_tokenizer_dir(name)"
            )
        hf = HFTokenizer.from_pretrained(path)
        vocab = hf.hf_tokenizer
        added = vocab.get_added_vocab()
        ids = [added.get(t) for t in stamp.get("end_of_turn", [])]
        merged = {**(stamp.get("variables") or {}), **variables}
        return cls(
            vocab,
            name=str(path),
            end_of_turn_ids=[int(i) for i in ids if i is not None],
            variables=merged,
            arguments_as_objects=bool(stamp.get("arguments_as_objects")),
            family=str(stamp.get("family", "")),
            parser=str(stamp.get("parser", "hermes")),
        )

    def _render(self, request: RenderRequest) -> str:
        request = replace(
            request,
            messages=_objects(request.messages) if self._objects else request.messages,
            variables={**self._variables, **request.variables},  # the call's kwargs win
        )
        source = self.chat_template_source
        if source is not None and source in _SHIPPED_SOURCES:
            # A template of ours: rendered in the project's Jinja environment, which gives
            # transformers' text (the tests compare them over randomized conversations) at a
            # fraction of the cost of its apply_chat_template (~0.4 ms a call).
            return render_chat_template(
                request.messages,
                request.tools,
                add_generation_prompt=request.generation,
                template=source,
                variables=request.variables,
            )
        return super()._render(request)


def load_family_tokenizer(
    name: str, directory: str | os.PathLike[str] | None = None, **variables: JSON
) -> FamilyTokenizer:
    """Build (once) and load family ``name``'s tokenizer; ``variables`` go to the template.

    Raises:
        ConfigError: As for :func:`family_tokenizer_dir`.
    """
    return FamilyTokenizer.from_directory(family_tokenizer_dir(name, directory), **variables)


fixup_module_metadata(__name__, globals())

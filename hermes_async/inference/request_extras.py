"""Server-specific request extras: which keys each token endpoint accepts, and where they go.

Invariant: a key the server kind does not accept, or one a typed field sets, is an
:class:`UnsupportedExtraError`, never a silent drop. vLLM's ``structured_outputs``
spelling works everywhere. The table and reasons: docs/decisions/006-request-extras.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Literal

from hermes_async.errors import ConfigError
from hermes_async.jsontypes import JSON, JSONObject

__all__ = (
    "EXTRA_KINDS",
    "ExtraKind",
    "UnsupportedExtraError",
    "accepted_extras",
    "split_extras",
)

ExtraKind = Literal["vllm", "completions", "sglang", "atropos"]
#: The server kinds :func:`split_extras` knows.
EXTRA_KINDS: tuple[str, ...] = ("vllm", "completions", "sglang", "atropos")


class UnsupportedExtraError(ConfigError):
    """A request extra the server kind does not accept (or one a typed field already sets).

    Attributes:
        kind: The server kind.
        key: The offending key.
    """

    def __init__(self, message: str, *, kind: str, key: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.key = key


# Scalar vLLM SamplingParams arguments: Atropos' server builds SamplingParams(**body) from
# JSON, so only values JSON can express natively (no StructuredOutputsParams object).
_ATROPOS = frozenset(
    {
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_p",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
    }
)
# vLLM's SamplingParams fields a caller may set through extras (vllm/sampling_params.py,
# checked against vLLM 0.32): the scalar ones above and the rest. The typed fields of our
# SamplingParams are not among them.
_VLLM_SAMPLING = _ATROPOS | frozenset(
    {
        "structured_outputs",
        "extra_args",
        "thinking_token_budget",
        "repetition_detection",
        "logprob_token_ids",
        "stream_interval",
        "watermarking",
    }
)
# GenerateRequest fields beside token_ids / sampling_params / stream.
_VLLM_TOP = frozenset({"request_id", "priority", "cache_salt", "kv_transfer_params"})
# vLLM's CompletionRequest sampling and extra parameters (the OpenAI completions route).
_COMPLETIONS = (_VLLM_SAMPLING - {"extra_args", "logprob_token_ids"}) | frozenset(
    {
        "response_format",
        "priority",
        "request_id",
        "cache_salt",
        "truncate_prompt_tokens",
        "vllm_xargs",
        "kv_transfer_params",
        "length_penalty",
        "user",
    }
)
# SGLang's SamplingParams (sglang/srt/sampling/sampling_params.py).
_SGLANG_SAMPLING = frozenset(
    {
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "regex",
        "json_schema",
        "ebnf",
        "structural_tag",
        "custom_params",
        "logit_bias",
        "stream_interval",
    }
)
# SGLang GenerateReqInput fields beside input_ids / sampling_params / logprob options.
_SGLANG_TOP = frozenset(
    {"rid", "priority", "lora_path", "custom_logit_processor", "return_hidden_states"}
)
#: Keys the clients set from the typed SamplingParams fields (or fix themselves), and the
#: field to use instead.
_TYPED: Mapping[str, str] = {
    "max_tokens": "SamplingParams.max_tokens",
    "max_new_tokens": "SamplingParams.max_tokens",
    "temperature": "SamplingParams.temperature (or the loop's temperature)",
    "top_p": "SamplingParams.top_p",
    "top_k": "SamplingParams.top_k",
    "seed": "SamplingParams.seed (or run(seed=...))",
    "sampling_seed": "SamplingParams.seed",
    "stop": "SamplingParams.stop",
    "stop_token_ids": "SamplingParams.stop_token_ids (or the loop's end_of_turn)",
    "logprobs": "nothing: the client always requests the sampled tokens' logprobs",
    "return_logprob": "nothing: the client always requests the sampled tokens' logprobs",
    "n": "nothing: one completion per request",
    "stream": "nothing: the client decides",
    "prompt": "nothing: the prompt ids are the loop's",
    "token_ids": "nothing: the prompt ids are the loop's",
    "input_ids": "nothing: the prompt ids are the loop's",
    "return_token_ids": "nothing: the client requests the ids it needs",
}

_GUIDED = {
    "guided_regex": "regex",
    "guided_json": "json",
    "guided_grammar": "grammar",
    "guided_choice": "choice",
}


# Built once: clients check every request's extras against these.
_ACCEPTED: Mapping[str, frozenset[str]] = {
    "vllm": _VLLM_SAMPLING | _VLLM_TOP | frozenset(_GUIDED),
    "completions": _COMPLETIONS | frozenset(_GUIDED),
    "sglang": _SGLANG_SAMPLING | _SGLANG_TOP | {"structured_outputs", "min_tokens", *_GUIDED},
    "atropos": _ATROPOS,
}


def accepted_extras(kind: str) -> frozenset[str]:
    """Every extra key ``kind`` accepts (translated spellings included).

    Raises:
        ConfigError: An unknown kind.
    """
    table = _ACCEPTED.get(kind)
    if table is None:
        raise ConfigError(f"unknown server kind {kind!r}; known: {', '.join(EXTRA_KINDS)}")
    return table


def _sglang_structured(value: JSON, kind: str) -> JSONObject:
    if not isinstance(value, dict) or not value:
        raise UnsupportedExtraError(
            f"structured_outputs must be an object such as {{'regex': ...}}, got {value!r}",
            kind=kind,
            key="structured_outputs",
        )
    out: JSONObject = {}
    for key, item in value.items():
        if key == "regex":
            out["regex"] = item
        elif key == "json":
            out["json_schema"] = item if isinstance(item, str) else json.dumps(item)
        elif key == "grammar":
            out["ebnf"] = item
        elif key == "choice" and isinstance(item, list):
            out["regex"] = "(" + "|".join(re.escape(str(c)) for c in item) + ")"
        elif key == "structural_tag":
            out["structural_tag"] = item
        else:
            raise UnsupportedExtraError(
                f"structured_outputs.{key} has no SGLang equivalent; SGLang takes regex, "
                "json (as json_schema), grammar (as ebnf), choice or structural_tag",
                kind=kind,
                key=f"structured_outputs.{key}",
            )
    if len({"regex", "json_schema", "ebnf"} & out.keys()) > 1:
        raise UnsupportedExtraError(
            f"SGLang accepts one of regex / json_schema / ebnf per request, got {sorted(out)}",
            kind=kind,
            key="structured_outputs",
        )
    return out


def split_extras(kind: str, extra: Mapping[str, JSON]) -> tuple[JSONObject, JSONObject]:
    """Check ``extra`` for server ``kind`` and split it into ``(sampling part, top-level part)``.

    Pure and cheap: clients call it per request; the loop once when built, so a bad key
    fails before any rollout.

    Raises:
        UnsupportedExtraError: A key the kind does not accept or a typed field sets; the
            message says what to use instead.
        ConfigError: An unknown ``kind``.
    """
    accepted = accepted_extras(kind)
    sampling: JSONObject = {}
    top: JSONObject = {}
    for key, value in extra.items():
        if key in _TYPED:
            raise UnsupportedExtraError(
                f"request extra {key!r} is set by a typed field; use {_TYPED[key]}",
                kind=kind,
                key=key,
            )
        if key not in accepted:
            raise UnsupportedExtraError(
                f"request extra {key!r} is not accepted by a {kind!r} token endpoint "
                f"(it would be dropped or rejected by the server); accepted: "
                f"{', '.join(sorted(accepted))}",
                kind=kind,
                key=key,
            )
        if key in _GUIDED:
            value = {_GUIDED[key]: value}
            key = "structured_outputs"
        if kind == "sglang":
            if key == "structured_outputs":
                sampling.update(_sglang_structured(value, kind))
            elif key == "min_tokens":
                sampling["min_new_tokens"] = value
            elif key in _SGLANG_TOP:
                top[key] = value
            else:
                sampling[key] = value
        elif kind == "vllm":
            if key in _VLLM_TOP:
                top[key] = value
            else:
                if key == "structured_outputs" and "structured_outputs" in sampling:
                    merged = dict(sampling["structured_outputs"])
                    merged.update(value)
                    value = merged
                sampling[key] = value
        else:
            top[key] = value
    return sampling, top

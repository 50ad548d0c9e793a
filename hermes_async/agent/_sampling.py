"""Phase 2 sampling parameters: the one precedence rule, end-of-turn ids, the per-turn hook.

A value given explicitly always wins over a default. Each field of a generation's
``SamplingParams`` comes from the first of: the turn's ``sampling_hook`` result (whole);
the run's ``seed``; the loop's ``temperature`` / ``max_tokens`` when given, and
``extra_body`` merged into ``extra``; the ``sampling`` argument; the defaults, with the
end-of-turn ids as ``stop_token_ids``. One key set to two values in ``extra_body`` and
``sampling`` is a ``ValueError``; ``extra_body`` keys naming a typed field fill it.

End-of-turn ids: the loop's ``end_of_turn``, else the tokenizer's ``end_of_turn_ids``
(family tokenizers: GLM-4.5 ends on ``<|observation|>`` or ``<|user|>``), else its EOS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from hermes_async.inference.generate import SamplingParams
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSON, JSONObject

__all__ = (
    "SamplingHook",
    "end_of_turn_ids",
    "resolve_sampling",
    "turn_sampling",
)

#: ``hook(turn, messages, params) -> SamplingParams | None``: called before each generation
#: with the 1-based turn, the conversation so far and the parameters the turn would use;
#: return replacement parameters for this turn (``dataclasses.replace(params, extra=...)``),
#: or ``None`` to keep them.
SamplingHook: TypeAlias = Callable[
    [int, Sequence[JSONObject], SamplingParams], "SamplingParams | None"
]

_DEFAULTS = SamplingParams()
#: extra_body keys that are typed SamplingParams fields.
_TYPED_FROM_EXTRA = ("top_k", "top_p", "seed", "stop", "stop_token_ids")
_LOOP_ARGUMENTS = {"temperature": "temperature", "max_tokens": "max_tokens"}


def end_of_turn_ids(tokenizer: Tokenizer, override: Sequence[int | str] | None) -> tuple[int, ...]:
    """The ids that end a model turn.

    Raises:
        ValueError: An empty ``override``, or a text in it that is not one token.
    """
    if override is not None:
        if not override:
            raise ValueError("end_of_turn must name at least one token (or be None)")
        ids: list[int] = []
        specials = tokenizer.special_tokens
        for item in override:
            if isinstance(item, int):
                ids.append(item)
                continue
            token = specials.get(item)
            if token is None:
                encoded = tokenizer.encode(item)
                if len(encoded) != 1:
                    raise ValueError(
                        f"end_of_turn token {item!r} is not a single token of tokenizer "
                        f"{tokenizer.name!r} (it encodes to {encoded}); pass its id instead"
                    )
                token = encoded[0]
            ids.append(token)
        return tuple(dict.fromkeys(ids))
    declared = getattr(tokenizer, "end_of_turn_ids", None)
    if declared:
        return tuple(int(i) for i in declared)
    return (tokenizer.eos_token_id,)


def resolve_sampling(
    sampling: SamplingParams | None,
    *,
    temperature: float | None,
    max_tokens: int | None,
    extra_body: Mapping[str, Any] | None,
    stop_ids: Sequence[int],
) -> SamplingParams:
    """The loop's sampling parameters by the precedence rule.

    Raises:
        ValueError: ``extra_body`` and ``sampling`` disagree, or ``extra_body`` sets
            ``temperature`` / ``max_tokens`` (use the arguments).
    """
    base = sampling or _DEFAULTS  # frozen: shared, not built (and checked) once per loop
    changes: dict[str, Any] = {}
    if temperature is not None:
        changes["temperature"] = temperature
    if max_tokens is not None:
        changes["max_tokens"] = max_tokens
    extra: dict[str, JSON] = dict(base.extra)
    for key, value in (extra_body or {}).items():
        if key in _LOOP_ARGUMENTS:
            raise ValueError(
                f"extra_body sets {key!r}; pass the loop's {_LOOP_ARGUMENTS[key]}= argument "
                "(or SamplingParams) instead"
            )
        if key in _TYPED_FROM_EXTRA:
            typed = tuple(value) if key in ("stop", "stop_token_ids") else value
            current = getattr(base, key)
            if current != getattr(_DEFAULTS, key) and current != typed:
                raise ValueError(
                    f"extra_body sets {key}={value!r} but sampling sets {key}={current!r}; "
                    "give it in one place"
                )
            changes[key] = typed
            continue
        if key in extra and extra[key] != value:
            raise ValueError(
                f"extra_body sets {key}={value!r} but sampling.extra sets "
                f"{key}={extra[key]!r}; give it in one place"
            )
        extra[key] = value
    changes["extra"] = extra
    if not changes.get("stop_token_ids", base.stop_token_ids):
        changes["stop_token_ids"] = tuple(stop_ids)
    # One replace: each one checks every field again, once per loop built (20,000 at start-up).
    return dataclasses.replace(base, **changes)


def turn_sampling(
    base: SamplingParams,
    *,
    turn: int,
    messages: Sequence[JSONObject],
    hook: SamplingHook | None,
    seed: int | None,
) -> SamplingParams:
    """This turn's parameters: the run's seed applied, then the hook's replacement, if any.

    A hook's result without stop ids gets the loop's; without a seed, the run's.

    Raises:
        TypeError: The hook returned something that is not ``SamplingParams`` or ``None``.
    """
    params = base if seed is None else dataclasses.replace(base, seed=seed)
    if hook is None:
        return params
    chosen = hook(turn, messages, params)
    if chosen is None:
        return params
    if not isinstance(chosen, SamplingParams):
        raise TypeError(
            f"sampling_hook must return SamplingParams or None, got {type(chosen).__name__}"
        )
    if not chosen.stop_token_ids:
        chosen = dataclasses.replace(chosen, stop_token_ids=params.stop_token_ids)
    if chosen.seed is None and params.seed is not None:
        chosen = dataclasses.replace(chosen, seed=params.seed)
    return chosen

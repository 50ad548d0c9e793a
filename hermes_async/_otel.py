"""Spans for the core, through opentelemetry-api when it is importable and a provider is set.

``with span("execute_tool todo", attrs) as s: s.set(key, value)``. Off, it costs one shared
no-op object; on, every span ends however its block exits, a cancellation marked. See
docs/architecture.md, "Tracing".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeAlias

try:  # an optional dependency: the core never needs it
    from opentelemetry import context as _context, trace as _trace
except ImportError:  # pragma: no cover - exercised where opentelemetry-api is absent
    _trace = None  # type: ignore[assignment]
    _context = None  # type: ignore[assignment]

__all__ = ("Span", "request_attributes", "span", "tracing")

_AttributeValue: TypeAlias = str | bool | int | float | tuple[str, ...] | tuple[int, ...]

#: The instrumentation scope's name.
SCOPE = "hermes_async"

_explicit: Any = None  # a TracerProvider given to hermes_async.telemetry.configure_telemetry
_disabled = False
_cache: tuple[Any, Any] | None = None  # (provider, tracer)
_UNKNOWN = object()
#: The global provider named by OTel's variable, read once: OTel reads it when first asked.
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _set_provider(provider: Any, *, disabled: bool = False) -> None:
    """Use ``provider`` (``None``: the global one); ``disabled``: never trace."""
    global _explicit, _disabled, _cache
    _explicit, _disabled, _cache = provider, disabled, None


def _tracer() -> Any:
    """The tracer of the configured (or global) provider, or ``None`` when tracing is off."""
    global _cache
    if _disabled or _trace is None:
        return None
    provider = _explicit
    if provider is None:
        if getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_FROM_ENV:
            # No global provider yet. get_tracer_provider() would look the environment up on
            # every span (a KeyError raised and caught): ~1% of a chat rollout's client CPU.
            return None
        provider = _trace.get_tracer_provider()
        if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
            return None
    cached = _cache
    if cached is not None and cached[0] is provider:
        return cached[1]
    from hermes_async._version import __version__

    tr = provider.get_tracer(SCOPE, __version__)
    _cache = (provider, tr)
    return tr


def tracing() -> bool:
    """True when spans are recorded."""
    return _tracer() is not None


class Span:
    """A started span, current for its ``with`` block (see :func:`span`)."""

    __slots__ = ("_span", "_token")

    def __init__(self, otel_span: Any) -> None:
        self._span = otel_span
        self._token: object = None

    def set(self, key: str, value: _AttributeValue | None) -> None:
        """Set an attribute (``None`` values are skipped)."""
        if value is not None:
            self._span.set_attribute(key, value)

    def event(self, name: str, attributes: Mapping[str, _AttributeValue] | None = None) -> None:
        """Add an event (a point in time) to the span."""
        self._span.add_event(name, attributes=dict(attributes) if attributes else None)

    def error(self, description: str) -> None:
        """Mark the span failed without an exception (e.g. a returned error)."""
        self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, description))

    def __enter__(self) -> Span:
        if self._token is None:
            self._token = _context.attach(_trace.set_span_in_context(self._span))
        return self

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        self.__exit__(*exc_info)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                if isinstance(exc, Exception):
                    self._span.record_exception(exc)
                    self._span.set_status(
                        _trace.Status(_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
                    )
                else:  # a cancellation (or GeneratorExit / KeyboardInterrupt)
                    self._span.set_attribute("hermes_async.cancelled", True)
                    self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, "cancelled"))
            if self._token is not _DETACHED:
                _context.detach(self._token)  # type: ignore[arg-type]
        finally:
            self._span.end()


class _NoSpan:
    """What :func:`span` returns when tracing is off: every method does nothing."""

    __slots__ = ()

    def set(self, key: str, value: _AttributeValue | None) -> None:
        pass

    def event(self, name: str, attributes: Mapping[str, _AttributeValue] | None = None) -> None:
        pass

    def error(self, description: str) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    async def __aenter__(self) -> _NoSpan:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pass


NO_SPAN = _NoSpan()
_DETACHED = object()  # the token of a span that is not made current


def span(
    name: str,
    attributes: Mapping[str, _AttributeValue | None] | None = None,
    *,
    kind: str = "",
    current: bool = True,
) -> Span | _NoSpan:
    """A span called ``name`` (``"{operation} {target}"``), current and ended by its ``with`` block.

    ``None`` attributes are skipped; ``kind="client"`` marks a request to another service;
    ``current=False`` for a span held across a ``yield`` (a generation stream).
    """
    tr = _tracer()
    if tr is None:
        return NO_SPAN
    attrs = {k: v for k, v in attributes.items() if v is not None} if attributes else None
    otel_kind = _trace.SpanKind.CLIENT if kind == "client" else _trace.SpanKind.INTERNAL
    out = Span(tr.start_span(name, kind=otel_kind, attributes=attrs))
    if not current:
        out._token = _DETACHED
    return out


def request_attributes(
    operation: str, body: Mapping[str, Any], sampling: Mapping[str, Any] | None = None
) -> dict[str, _AttributeValue | None]:
    """GenAI request attributes of a generation (``sampling``: where the parameters are)."""
    params = body if sampling is None else sampling
    model = body.get("model")
    return {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model if isinstance(model, str) else None,
        "gen_ai.request.max_tokens": _number(params.get("max_tokens")),
        "gen_ai.request.temperature": _number(params.get("temperature")),
        "gen_ai.request.top_p": _number(params.get("top_p")),
        "gen_ai.request.seed": _number(params.get("seed")),
    }


def _number(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None

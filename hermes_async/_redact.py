"""Secret redaction for everything the library logs, reports as an error, or shows on a dashboard.

:func:`redact` applies three nets: known token shapes, credentials by where they sit (URL
userinfo, secret-named assignments, environment dumps) and the values of this process's
secret-named variables. docs/decisions/042-secret-redaction.md has the rules and where they
are applied.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = (
    "REDACTED",
    "redact",
    "redact_messages",
    "redact_record",
    "redact_url",
    "redact_urls",
    "secret_env_values",
    "secret_name",
)

#: What a secret is replaced with.
REDACTED = "[REDACTED]"

#: Shorter values of secret-named variables are not redacted (``TOKEN_LIMIT=8`` is not a secret,
#: and replacing every "8" would destroy the text).
_MIN_SECRET_VALUE_CHARS = 6

_SECRET_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE", re.I)

_TOKEN_SHAPES = (
    r"\bsk-(?:ant-|or-|proj-)?[A-Za-z0-9_\-]{16,}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
    r"\bhf_[A-Za-z0-9]{20,}",
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    r"\bAIza[0-9A-Za-z_\-]{30,}",
    # A JWT: base64url header (always '{"...' -> 'eyJ'), payload and signature.
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
)
#: Every known token shape, one pass.
_TOKENS = re.compile("|".join(f"(?:{shape})" for shape in _TOKEN_SHAPES))

#: A PEM block, to its END line or (a truncated text) to the end.
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]{1,60})-----.*?(?:-----END \1-----|\Z)", re.S)

#: ``Authorization: <scheme> <credential>`` (header, JSON or assignment spelling).
_AUTHORIZATION = re.compile(
    r"""(?P<head>\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?)"""
    r"""(?:(?P<scheme>[A-Za-z][A-Za-z0-9_\-]*)[ \t]+)?(?P<cred>[^\s"',;}]+)""",
    re.I,
)
_BEARER = re.compile(r"\b(Bearer)\s+[A-Za-z0-9._\-+/=]{8,}", re.I)

#: ``name=value``, ``name: value``, ``"name": "value"`` anywhere; the name is checked after.
_ASSIGNMENT = re.compile(
    r"""(?P<key>(?P<q>["']?)(?P<name>[A-Za-z_][A-Za-z0-9_.\-]{0,80})(?P=q)\s*[:=]\s*)"""
    r"""(?P<quote>["']?)(?P<value>[^\s"',;}&]{4,})"""
)
#: An ini / env-file line: ``name = value`` or ``export NAME=value`` (the whole rest).
_LINE_ASSIGNMENT = re.compile(
    r"""^(?P<key>[ \t]*(?:export[ \t]+)?(?P<name>[A-Za-z_][A-Za-z0-9_.\-]{0,80})[ \t]*[=:][ \t]*)"""
    r"""(?P<value>\S.*?)[ \t]*$""",
    re.M,
)

#: One ``NAME=value`` entry of a NUL-separated environment dump (the value runs to the NUL).
_ENVIRON_ENTRY = re.compile(r"(?:^|(?<=\x00))(?P<key>(?P<name>[A-Za-z_][A-Za-z0-9_]*)=)[^\x00]+")

_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_STRONG = ("secret", "password", "passwd", "passphrase", "credential", "privatekey")
_LAST_WORDS = frozenset({"token", "apikey", "pass", "pwd", "auth", "cookie", "secret"})
_NOT_SECRET_TOKENS = frozenset({"eos", "bos", "pad", "unk", "sep", "cls", "mask", "max", "num"})


@functools.lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """Whether an assignment's name looks like it holds a credential (docs/decisions/042)."""
    words = [w.lower() for w in _WORDS.findall(name)]
    if not words:
        return False
    joined = "".join(words)
    if any(strong in joined for strong in _STRONG):
        return True
    if joined in ("pwd", "oldpwd"):
        return False  # the shell's working directories (``env`` output), not passwords
    last = words[-1]
    if last in ("authorization", "authorisation"):
        return False  # handled by the Authorization rule, which keeps the scheme
    if last == "key":
        return len(words) > 1
    if last == "token":
        return len(words) == 1 or words[-2] not in _NOT_SECRET_TOKENS
    return last in _LAST_WORDS or joined.endswith("apikey")


@functools.lru_cache(maxsize=1024)
def _secret_env_name(name: str) -> bool:
    return bool(_SECRET_ENV_NAME.search(name))


def _scan_env(env: Mapping[str, str]) -> list[str]:
    values = {
        value
        for name, value in env.items()
        if _secret_env_name(name) and len(value) >= _MIN_SECRET_VALUE_CHARS
    }
    return sorted(values, key=lambda v: (-len(v), v))


_ENV_CACHE: tuple[int, list[str]] | None = None


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of variables whose names say they are secrets, longest first.

    For ``os.environ`` the scan is cached against a hash of the environment, so a variable
    set at run time is still picked up.
    """
    global _ENV_CACHE
    if environ is not None:
        return _scan_env(environ)
    raw = getattr(os.environ, "_data", None)  # CPython's bytes mapping behind os.environ
    if not isinstance(raw, dict):
        return _scan_env(os.environ)
    fingerprint = hash(frozenset(raw.items()))
    cached = _ENV_CACHE
    if cached is None or cached[0] != fingerprint:
        cached = _ENV_CACHE = (fingerprint, _scan_env(os.environ))
    return cached[1]


def _authorization(match: re.Match[str]) -> str:
    if match.group("cred") == REDACTED or match.group("cred").startswith(REDACTED):
        return match.group(0)
    scheme = match.group("scheme")
    if scheme is None:
        return match.group("head") + REDACTED
    return f"{match.group('head')}{scheme} {REDACTED}"


#: A name and its separator inside the value of a non-secret assignment.
_INNER_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]{0,80})[:=]")


def _assignment(match: re.Match[str]) -> str:
    value = match.group("value")
    if REDACTED in value:
        return match.group(0)
    if secret_name(match.group("name")):
        return match.group("key") + match.group("quote") + REDACTED
    # Not a secret name, but its value may hold one: ``RuntimeError: password=hunter22`` (an
    # exception's last traceback line) matches with the name ``RuntimeError``. The rest of the
    # value after a secret name inside it goes. One linear scan of the value (no re-search of
    # the text, which would be quadratic on ``a=b=c=...``).
    for inner in _INNER_ASSIGNMENT.finditer(value):
        if secret_name(inner.group(1)):
            kept = match.group(0)[: match.start("value") - match.start()]
            return kept + value[: inner.end()] + REDACTED
    return match.group(0)


def _line_assignment(match: re.Match[str]) -> str:
    value = match.group("value")
    if REDACTED in value or not secret_name(match.group("name")):
        return match.group(0)
    quote = value[0] if value[0] in "\"'" else ""
    return match.group("key") + quote + REDACTED + quote


def redact(
    text: str,
    *,
    extra_values: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> str:
    """Return ``text`` with secrets replaced by :data:`REDACTED`.

    Args:
        extra_values: Further literal secrets to remove (e.g. a configured API key).
        environ: The environment to take secret values from (default: ``os.environ``).
    """
    if not text:
        return text
    literals = [v for v in extra_values if v and len(v) >= _MIN_SECRET_VALUE_CHARS]
    for value in [*sorted(literals, key=len, reverse=True), *secret_env_values(environ)]:
        if value in text:
            text = text.replace(value, REDACTED)
    if "\x00" in text:  # an environment dump: each entry is a line of its own
        text = _ENVIRON_ENTRY.sub(
            lambda m: m.group("key") + REDACTED if secret_name(m.group("name")) else m.group(0),
            text,
        )
    if "-----BEGIN " in text:
        text = _PEM.sub(
            lambda m: f"-----BEGIN {m.group(1)}-----{REDACTED}-----END {m.group(1)}-----", text
        )
    text = redact_urls(text)
    text = _TOKENS.sub(REDACTED, text)
    text = _AUTHORIZATION.sub(_authorization, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _LINE_ASSIGNMENT.sub(_line_assignment, text)
    return _ASSIGNMENT.sub(_assignment, text)


def redact_messages(messages: Iterable[Any]) -> list[Any]:
    """A copy of chat ``messages`` with every string in them redacted."""
    cache: dict[str, str] = {}
    return [_redact_value(m, cache) for m in messages]


def _redact_value(value: Any, cache: dict[str, str]) -> Any:
    if isinstance(value, str):
        found = cache.get(value)
        if found is None:
            found = cache[value] = redact(value)
        return found
    if isinstance(value, Mapping):
        return {k: _redact_value(v, cache) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value(v, cache) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# Log records


def redact_record(record: logging.LogRecord) -> None:
    """Redact a log record in place: its formatted message and its exception text.

    ``import hermes_async`` wraps the log-record factory so that every record of a
    ``hermes_async`` logger passes through here.
    """
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: leave it to the handler to report
        return
    record.msg, record.args = redact(message), None
    if record.exc_info and record.exc_info[1] is not None:
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))


# --------------------------------------------------------------------------------------------
# URL redaction (pure, standard library only: ``import hermes_async`` installs the log
# redaction, and importing the package must not load the HTTP stack)

#: Query parameter names (lower case, ``-`` as ``_``) that carry a credential when they
#: contain one of these words: ``api_key``, ``access_token``, ``X-Amz-Signature``, ``sig``...
_SECRET_PARAM_WORDS = (
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "auth",
    "signature",
    "credential",
    "session",
)
_SECRET_PARAM_NAMES = frozenset({"sig", "code", "jwt"})

#: A URL inside free text: a scheme, ``://`` and everything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"""\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s"'<>`]+""")


def _secret_param(name: str) -> bool:
    key = urllib.parse.unquote_plus(name).strip().lower().replace("-", "_")
    return key in _SECRET_PARAM_NAMES or any(word in key for word in _SECRET_PARAM_WORDS)


def _redact_query(query: str) -> str:
    parts = []
    for item in query.split("&"):
        name, sep, value = item.partition("=")
        if sep and value and _secret_param(name):
            item = f"{name}={REDACTED}"
        parts.append(item)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """``url`` without credentials: userinfo and secret query values become ``[REDACTED]``.

    ``http://user:pw@host:8000/v1?api_key=sk-1&n=2`` becomes
    ``http://[REDACTED]@host:8000/v1?api_key=[REDACTED]&n=2``. Never raises: a string that is
    not a URL comes back unchanged.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority_end = len(rest)
    for stop in "/?#":
        index = rest.find(stop)
        if index != -1:
            authority_end = min(authority_end, index)
    authority, tail = rest[:authority_end], rest[authority_end:]
    if "@" in authority:
        authority = f"{REDACTED}@{authority.rpartition('@')[2]}"
    path, qmark, query = tail.partition("?")
    if qmark:
        query, hash_, fragment = query.partition("#")
        tail = f"{path}?{_redact_query(query)}{hash_}{fragment}"
    return f"{scheme}://{authority}{tail}"


def redact_urls(text: str) -> str:
    """``text`` with :func:`redact_url` applied to every URL in it (for exception texts)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)

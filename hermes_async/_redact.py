"""Secret redaction for everything the library logs, reports as an error, or sends to wandb.

Two nets, applied together by :func:`redact`:

* **Known token shapes**: OpenAI/Anthropic/OpenRouter ``sk-...`` keys, GitHub ``ghp_``/``gho_``/
  ``github_pat_`` tokens, Slack ``xox?-`` tokens, Hugging Face ``hf_`` tokens, AWS access key
  ids, ``Bearer ...`` headers, and ``key=value`` / ``"key": "value"`` pairs whose key names a
  secret (``api_key``, ``token``, ``password``, ``secret``, ``authorization``).
* **Values of this process's secret variables**: every environment variable whose *name*
  contains ``KEY``, ``TOKEN``, ``SECRET`` or ``PASSWORD`` (case-insensitive) and whose value is
  at least :data:`MIN_SECRET_VALUE_CHARS` long is replaced wherever it appears, whatever its
  shape.

Redaction is for logs and dashboards (tool error details, rollout tables, exception messages,
the ``error`` of a scored rollout), never for training data: the JSONL of scored groups keeps the exact messages the tokens encode.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

__all__ = ("MIN_SECRET_VALUE_CHARS", "REDACTED", "redact", "secret_env_values")

#: What a secret is replaced with.
REDACTED = "[REDACTED]"

#: Shorter values of secret-named variables are not redacted (``TOKEN_LIMIT=8`` is not a secret,
#: and replacing every "8" would destroy the text).
MIN_SECRET_VALUE_CHARS = 6

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.I)

_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bsk-(?:ant-|or-|proj-)?[A-Za-z0-9_\-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"),
)

# key=value, key: value, "key": "value" where the key names a secret; the value is replaced.
_ASSIGNMENT = re.compile(
    r"""(?P<key>["']?[A-Za-z0-9_\-]*(?:api[_-]?key|apikey|token|secret|password|passwd|authorization)["']?\s*[:=]\s*)"""
    r"""(?P<quote>["']?)(?P<value>(?:Bearer\s+)?[^\s"',;}&]{4,})""",
    re.I,
)
_BEARER = re.compile(r"\b(Bearer)\s+[A-Za-z0-9._\-+/=]{8,}", re.I)


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of variables whose names say they are secrets, longest first."""
    env = os.environ if environ is None else environ
    values = {
        value
        for name, value in env.items()
        if _SECRET_NAME.search(name) and len(value) >= MIN_SECRET_VALUE_CHARS
    }
    return sorted(values, key=lambda v: (-len(v), v))


def redact(
    text: str,
    *,
    extra_values: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> str:
    """Return ``text`` with secrets replaced by :data:`REDACTED`.

    Args:
        text: Anything about to be logged or shown on a dashboard.
        extra_values: Further literal secrets to remove (e.g. a configured API key).
        environ: The environment to take secret values from (default: ``os.environ``).
    """
    if not text:
        return text
    literals = [v for v in extra_values if v and len(v) >= MIN_SECRET_VALUE_CHARS]
    for value in [*sorted(literals, key=len, reverse=True), *secret_env_values(environ)]:
        if value in text:
            text = text.replace(value, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _ASSIGNMENT.sub(
        lambda m: (
            m.group("key") + m.group("quote") + REDACTED
            if m.group("value") != REDACTED
            else m.group(0)
        ),
        text,
    )
    return text

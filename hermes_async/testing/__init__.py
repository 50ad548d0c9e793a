"""Test helpers for hermes_async and for environments built on it.

Fakes (scripted model server, in-memory sandbox with fault injection) and conformance suites live
here, in the public package, so environment authors can write deterministic ``pytest`` + anyio
tests of their own environments.
"""

from __future__ import annotations

__all__: list[str] = []

"""Configuration of the web tools (owned by the web-tools layer; extended there)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WebSettings"]


@dataclass(slots=True)
class WebSettings:
    """Web-tool configuration carried on a rollout's ``ToolRuntime``."""

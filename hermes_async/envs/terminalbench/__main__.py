"""``python -m hermes_async.envs.terminalbench serve|process|evaluate`` (atroposlib's CLI)."""

from __future__ import annotations

from hermes_async.envs.terminalbench.env import TerminalBench2EvalEnv

__all__ = ()

if __name__ == "__main__":
    TerminalBench2EvalEnv.cli()

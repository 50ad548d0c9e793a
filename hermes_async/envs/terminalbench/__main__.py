"""``python -m hermes_async.envs.terminalbench serve|process|evaluate`` (atroposlib's CLI).

``evaluate`` exits 1 when trials ran and none produced a reward.
"""

from __future__ import annotations

from hermes_async.envs.terminalbench.env import TerminalBench2EvalEnv

__all__ = ()

if __name__ == "__main__":
    TerminalBench2EvalEnv.cli()

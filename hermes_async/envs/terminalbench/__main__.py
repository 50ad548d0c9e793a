"""``python -m hermes_async.envs.terminalbench serve|process|evaluate`` (atroposlib's CLI).

``evaluate`` exits 1 when trials ran and none produced a reward.
"""

from __future__ import annotations

import sys

from hermes_async.envs.terminalbench.env import NoRewardError, TerminalBench2EvalEnv

__all__ = ()

if __name__ == "__main__":
    try:
        TerminalBench2EvalEnv.cli()
    except NoRewardError as exc:
        print(f"terminalbench: {exc}", file=sys.stderr)
        sys.exit(1)

"""The former import path of the tool-result budget: re-exports :mod:`hermes_async.agent.budget`.

The code lives in :mod:`hermes_async.agent.budget`; every name of its ``__all__`` is here too.
"""

from __future__ import annotations

from hermes_async.agent.budget import *  # noqa: F403
from hermes_async.agent.budget import __all__ as __all__

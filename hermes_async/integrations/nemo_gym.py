"""NeMo Gym agent server: ``POST /run`` runs one hermes_async rollout and returns its tokens.

:class:`GymAgent` and :func:`create_app` (``hermes-async serve-gym``) need no nemo-gym.
``HermesGymAgent`` (and its ``HermesGymAgentConfig``), the same agent as a server class for
Gym's own launcher, subclasses nemo-gym's classes: it is imported when first named and needs
the ``nemo-gym`` extra. What maps to what: ``docs/trainers/nemo_gym.md``.
"""

from __future__ import annotations

from typing import Any

from hermes_async._exports import fixup_module_metadata
from hermes_async.integrations._gym_run import (
    GymAgent,
    UnsupportedRequestError,
    create_app,
    failure_fields,
    messages_from_params,
    open_token_client,
    render_response,
)

__all__ = (
    "GymAgent",
    "UnsupportedRequestError",
    "create_app",
    "failure_fields",
    "messages_from_params",
    "open_token_client",
    "render_response",
)


def __getattr__(name: str) -> Any:
    # Gym's own server class subclasses nemo-gym's: imported only when asked for.
    if name in ("HermesGymAgent", "HermesGymAgentConfig"):
        from hermes_async.integrations import _nemo_gym_agent

        return getattr(_nemo_gym_agent, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


fixup_module_metadata(__name__, globals())

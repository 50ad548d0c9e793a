"""Trainer integrations: the seams where today's RL trainers take an external rollout layer.

One module per trainer, each behind its own extra; importing this package imports none:
``nemo_gym``, ``verl``, ``skyrl``, ``slime`` and ``trl``. Each takes a task source (an
environment or ``item -> RolloutTask``) and runs the rollout core with its token clients, so
the trainer receives the trajectory's own ids, masks and logprobs. One page per trainer:
docs/trainers/.
"""

from __future__ import annotations

__all__ = ()

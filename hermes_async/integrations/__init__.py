"""Trainer integrations: the seams where today's RL trainers take an external rollout layer.

One module per trainer, each behind its own extra; importing this package imports none:

* :mod:`~hermes_async.integrations.nemo_gym` — a NeMo Gym agent server (``POST /run``):
  ``hermes-async serve-gym``, or ``HermesGymAgent`` in Gym's own launcher (extra ``nemo-gym``);
* :mod:`~hermes_async.integrations.verl` — a registered verl ``AgentLoopBase`` (``verl``);
* :mod:`~hermes_async.integrations.skyrl` — a SkyRL ``GeneratorInterface`` (``skyrl``);
* :mod:`~hermes_async.integrations.slime` — a slime custom generate function (no package);
* :mod:`~hermes_async.integrations.trl` — a TRL ``GRPOTrainer`` ``rollout_func`` (``trl``).

Each takes a task source — an environment (``HermesAgentBaseEnv.rollout_task``) or a function
``item -> RolloutTask`` — and runs :func:`~hermes_async.agent.run_rollout` /
:func:`~hermes_async.agent.run_group` with the core's token clients; the trainer receives the
trajectory's own ids, masks and logprobs. One page per trainer: ``docs/trainers/``.
"""

from __future__ import annotations

__all__ = ()

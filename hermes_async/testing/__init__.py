"""Test helpers for hermes_async and for environments built on it.

Fakes and conformance suites live here, in the public package, so environment authors can write
deterministic ``pytest`` + anyio tests of their own environments:

* :class:`ScriptedModelServer` — one ASGI app serving vLLM ``/inference/v1/generate``, Atropos
  and SGLang ``/generate`` and OpenAI chat from a :class:`ScriptedPolicy` (a :class:`FixedScript`
  or any ``PolicyRequest -> str`` oracle), with seeded chunking, latency and :class:`Fault` s.
  Serve it in-process (:func:`open_asgi_transport`) or over loopback
  (:func:`open_loopback_server`, needs the ``testing`` extra); :func:`open_scripted_endpoint`
  does both in one step. :func:`hermes_tool_call` writes a tool call into a policy's reply.
* :class:`FaultyServer` — ASGI middleware that makes a whole server fail, rate limit (429 with
  ``Retry-After``), slow down or go down while a test runs (server pools, failover).
* :func:`open_hostile_server` — a loopback server that attacks the client's bounds (endless
  heads, bodies, events, completions, token streams; JSON too deep to decode), one
  :data:`HostileCase` per server; :data:`POPUP_FLOOD_PAGE` attacks the browser's.
* :class:`FakeSandbox` — an in-memory sandbox with scripted commands, latency and faults;
  :func:`run_conformance` / :data:`CONFORMANCE_CHECKS` — the checks every sandbox backend passes.
* :class:`FakeModal` — a double of modal 1.6's async API; :class:`FakeE2B` and
  :class:`FakeDaytona` — doubles of the e2b and daytona SDKs' async APIs (real local commands,
  leak books, injectable create latency, hangs, failures and sandbox deaths);
  :mod:`hermes_async.testing.fake_web` —
  a fake web provider, resolver and loopback-only transport.
"""

from __future__ import annotations

from hermes_async.testing.daytona_double import FakeDaytona
from hermes_async.testing.e2b_double import FakeE2B
from hermes_async.testing.endpoint import ScriptedEndpoint, open_scripted_endpoint
from hermes_async.testing.fake_sandbox import ExecCall, ExecScript, FakeSandbox, FakeSandboxFactory
from hermes_async.testing.hostile import (
    HOSTILE_CASES,
    POPUP_FLOOD_PAGE,
    HostileCase,
    HostileServer,
    open_hostile_server,
)
from hermes_async.testing.http import open_app_endpoint, open_asgi_transport, open_loopback_server
from hermes_async.testing.modal_double import FakeModal
from hermes_async.testing.sandbox_conformance import (
    CONFORMANCE_CHECKS,
    ConformanceCheck,
    run_conformance,
)
from hermes_async.testing.scripted_server import (
    Fault,
    FixedScript,
    PolicyRequest,
    ScriptedModelServer,
    ScriptedPolicy,
    ScriptExhaustedError,
    ServedRequest,
    hermes_tool_call,
    parse_chatml,
)
from hermes_async.testing.server_faults import FaultyServer

__all__ = (
    "CONFORMANCE_CHECKS",
    "HOSTILE_CASES",
    "POPUP_FLOOD_PAGE",
    "ConformanceCheck",
    "ExecCall",
    "ExecScript",
    "FakeDaytona",
    "FakeE2B",
    "FakeModal",
    "FakeSandbox",
    "FakeSandboxFactory",
    "Fault",
    "FaultyServer",
    "FixedScript",
    "HostileCase",
    "HostileServer",
    "PolicyRequest",
    "ScriptExhaustedError",
    "ScriptedEndpoint",
    "ScriptedModelServer",
    "ScriptedPolicy",
    "ServedRequest",
    "hermes_tool_call",
    "open_app_endpoint",
    "open_asgi_transport",
    "open_hostile_server",
    "open_loopback_server",
    "open_scripted_endpoint",
    "parse_chatml",
    "run_conformance",
)

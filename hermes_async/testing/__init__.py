"""Test helpers for hermes_async and for environments built on it.

Scripted and faulty model servers, hostile servers, a fake sandbox with the backends'
conformance checks, and doubles of the Modal, E2B, Daytona and web APIs: everything an
environment author needs for deterministic ``pytest`` + anyio tests. docs/architecture.md
("The testing kit") lists them.
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

"""BrowserSettings, the executable search and Chromium's flags (no browser started)."""

from __future__ import annotations

import pathlib
import stat

import pytest

from hermes_async.errors import ConfigError
from hermes_async.tools.browser.settings import (
    BrowserSettings,
    chromium_args,
    find_chromium,
    launch_environment,
)


def _executable(path: pathlib.Path) -> str:
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_configured_executable_wins_and_a_bad_one_names_the_fix(tmp_path: pathlib.Path) -> None:
    exe = _executable(tmp_path / "my-chromium")
    assert find_chromium(exe, {}) == exe
    assert find_chromium(None, {"HERMES_BROWSER_EXECUTABLE": exe}) == exe
    with pytest.raises(ConfigError, match=r"'/nope/chromium' \(from HERMES_BROWSER_EXECUTABLE\)"):
        find_chromium(None, {"HERMES_BROWSER_EXECUTABLE": "/nope/chromium"})
    plain = tmp_path / "not-executable"
    plain.write_text("")
    with pytest.raises(ConfigError, match=r"BrowserSettings.executable_path.*apt-get install"):
        find_chromium(str(plain), {})


def test_the_search_follows_the_candidates_and_path(tmp_path: pathlib.Path) -> None:
    _executable(tmp_path / "chromium-browser")
    env = {"PATH": str(tmp_path)}
    found = find_chromium(
        None, env, candidates=("/no/such/chromium", "chromium", "chromium-browser")
    )
    assert found == str(tmp_path / "chromium-browser")
    with pytest.raises(ConfigError) as info:
        find_chromium(None, {"PATH": str(tmp_path / "empty")}, candidates=("chromium",))
    message = str(info.value)
    assert "no Chromium executable found (looked for chromium)" in message
    assert "apt-get install chromium" in message and "HERMES_BROWSER_EXECUTABLE" in message
    assert "never downloads" in message


def test_from_env_reads_the_documented_variables() -> None:
    settings = BrowserSettings.from_env(
        {
            "HERMES_BROWSER_EXECUTABLE": "/opt/chrome",
            "HERMES_BROWSER_ALLOW": "intranet.example, 10.0.0.0/8 ,",
            "HERMES_BROWSER_MAX_SESSIONS": "4",
            "BROWSER_INACTIVITY_TIMEOUT": "120",
            "HERMES_BROWSER_VISION_URL": "http://vlm:8000/v1",
            "HERMES_BROWSER_VISION_MODEL": "qwen-vl",
            "HERMES_BROWSER_VISION_API_KEY": "sk-secret",
        }
    )
    assert settings.executable_path == "/opt/chrome"
    assert settings.allow == ("intranet.example", "10.0.0.0/8")
    assert settings.max_sessions == 4 and settings.idle_timeout == 120.0
    assert settings.vision is not None and settings.vision.model == "qwen-vl"
    assert "sk-secret" not in repr(settings)
    defaults = BrowserSettings.from_env({})
    assert defaults == BrowserSettings()
    assert defaults.idle_timeout == 300.0 and defaults.reap_interval == 30.0
    assert defaults.snapshot_max_chars == 8_000


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"HERMES_BROWSER_VISION_URL": "http://v/v1"}, "HERMES_BROWSER_VISION_MODEL is not"),
        ({"HERMES_BROWSER_MAX_SESSIONS": "many"}, "'many' is not an integer"),
        ({"BROWSER_INACTIVITY_TIMEOUT": "soon"}, "'soon' is not a number"),
        ({"HERMES_BROWSER_ALLOW": "10.0.0.0/99"}, "neither a host name nor a valid CIDR"),
        ({"HERMES_BROWSER_MAX_SESSIONS": "0"}, "max_sessions must be an integer >= 1"),
    ],
)
def test_bad_values_are_config_errors_naming_them(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BrowserSettings.from_env(environ)


def test_chromium_cannot_resolve_anything_and_gets_no_secrets() -> None:
    args = chromium_args(BrowserSettings(extra_args=("--lang=de",)))
    assert "--host-resolver-rules=MAP * ~NOTFOUND" in args
    assert "--force-webrtc-ip-handling-policy=disable_non_proxied_udp" in args
    assert {"--disable-quic", "--disable-background-networking", "--no-first-run"} <= set(args)
    assert args[-1] == "--lang=de"
    env = launch_environment({"PATH": "/usr/bin", "HOME": "/root", "OPENAI_API_KEY": "sk-x"})
    assert env == {"PATH": "/usr/bin", "HOME": "/root"}

"""``WorkerConfig``: a worker refuses what cannot work before it serves."""

from __future__ import annotations

import pytest

from hermes_async.errors import ConfigError
from hermes_async.service.config import WorkerConfig, open_configured_worker

ENV = ("echo=hermes_async.testing.worker_tasks:echo_task",)


@pytest.mark.parametrize("url", ["", "notaurl", "ftp://h", "http://h:abc", "http://h:99999"])
def test_a_server_that_is_not_an_http_url_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match=f"--server {url!r} is not a model server URL"):
        WorkerConfig(ENV, (url,))  # was a worker that served and failed every group


def test_http_urls_pass() -> None:
    urls = ("http://x", "https://[::1]:8000/v1", "http://127.0.0.1:1")
    assert WorkerConfig(ENV, urls).servers == urls


@pytest.mark.anyio
async def test_an_api_key_variable_that_is_not_set_is_refused_where_the_worker_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HERMES_TEST_NO_SUCH_KEY", raising=False)
    # Built anywhere (a Ray driver ships it to the workers' nodes), checked where it opens.
    config = WorkerConfig(
        ENV, ("http://127.0.0.1:9",), api="chat", api_key_env="HERMES_TEST_NO_SUCH_KEY"
    )
    with pytest.raises(ConfigError, match="--api-key-env HERMES_TEST_NO_SUCH_KEY: the variable is"):
        async with open_configured_worker(config):  # was: a worker sending no key
            pass

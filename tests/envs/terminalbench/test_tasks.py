"""task.toml schemas 1.0 to 1.4 into one HarborTask; deprecated spellings; invalid fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hermes_async.envs.terminalbench.dataset import load_dataset
from hermes_async.envs.terminalbench.task import (
    DEFAULT_BUILD_TIMEOUT_SECONDS,
    DEFAULT_VERIFIER_TIMEOUT_SECONDS,
    NetworkPolicy,
    TaskError,
    TaskLimits,
    dockerfile_base_images,
    load_task,
    network_reasons,
    parse_size_mb,
)
from tests.envs.terminalbench.helpers import make_task

SCHEMA_1_0 = """
version = "1.0"

[metadata]
author_name = "someone"
author_email = "someone@example.com"
difficulty = "hard"
category = "security"
tags = ["crypto", "bash"]
expert_time_estimate_min = 30
junior_time_estimate_min = 120

[verifier]
timeout_sec = 900.0

[agent]
timeout_sec = 1800.0

[environment]
build_timeout_sec = 600.0
docker_image = "alexgshaw/crack-7z-hash:20251031"
cpus = 2
memory = "4G"
storage = "10G"
"""

SCHEMA_1_1 = """
schema_version = "1.1"
artifacts = []

[task]
name = "terminal-bench/fix-git"
description = "Recover lost work."
keywords = ["git", "recovery"]

[[task.authors]]
name = "A. Author"
email = "a@example.com"

[metadata]
difficulty = "medium"
category = "software-engineering"
tags = ["git"]

[verifier]
timeout_sec = 1800.0

[verifier.env]
STRICT = "1"

[agent]
timeout_sec = 3600.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 4096
storage_mb = 10240
gpus = 0
allow_internet = true
mcp_servers = []

[environment.env]
APP_MODE = "test"

[solution.env]
HINT = "reflog"
"""

SCHEMA_1_4 = """
schema_version = "1.4"

[metadata]
category = "networking"

[verifier]
timeout_sec = 120.0
user = "root"
network_mode = "no-network"

[[verifier.collect]]
command = "cp /var/log/app.log /logs/artifacts/"
timeout_sec = 10.0

[[verifier.collect]]
command = "true"
user = "agent"
service = "main"

[agent]
timeout_sec = 600.0
user = 1000
allowed_hosts = ["PyPI.org.", "files.pythonhosted.org", "pypi.org"]

[environment]
workdir = "/srv/app"
cpus = 0.5
memory_mb = 1024
network_mode = "public"
healthcheck = { command = "true", interval_sec = 1.0 }
gpu_types = ["H100"]
some_future_key = { nested = true }

[brand_new_table]
anything = 1
"""


def test_schema_1_0_deprecated_spellings(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "crack-7z-hash", SCHEMA_1_0, dockerfile=None))
    assert task.name == "crack-7z-hash"
    assert task.schema_version == "1.0"
    assert task.category == "security"
    assert task.difficulty == "hard"
    assert task.tags == ("crypto", "bash")
    env = task.environment
    assert (env.cpus, env.memory_mb, env.storage_mb, env.gpus) == (2.0, 4096, 10240, None)
    assert env.docker_image == "alexgshaw/crack-7z-hash:20251031"
    assert env.build_context is None and env.dockerfile is None
    assert task.verifier_timeout_sec == 900.0 and task.agent_timeout_sec == 1800.0
    # allow_internet absent: public, in every phase.
    assert set(task.network.values()) == {NetworkPolicy("public")}
    # A prebuilt image from a registry is a network need (this box cannot pull).
    assert task.needs_network
    assert task.network_reasons == (
        "image 'alexgshaw/crack-7z-hash:20251031' must be pulled from a registry",
    )
    assert task.metadata["expert_time_estimate_min"] == 30


def test_schema_1_1_tables(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "fix-git", SCHEMA_1_1))
    assert task.schema_version == "1.1"
    assert task.name == "fix-git"  # the folder, not [task].name
    assert task.description == "Recover lost work."
    assert task.tags == ("git", "recovery")  # metadata tags + keywords, no repeats
    assert (task.environment.memory_mb, task.environment.storage_mb) == (4096, 10240)
    assert task.environment.gpus == 0
    assert dict(task.environment.env) == {"APP_MODE": "test"}
    assert dict(task.verifier_env) == {"STRICT": "1"}
    assert dict(task.solution_env) == {"HINT": "reflog"}
    assert task.environment.build_timeout_sec == 300.0
    assert task.environment.build_context == tmp_path / "fix-git" / "environment"
    assert task.environment.base_images == ("hermes-async-base:bookworm",)
    assert not task.needs_network  # allow_internet = true is a permission, not a need


def test_schema_1_4_phases_users_collect_unknown_keys(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "svc", SCHEMA_1_4))
    assert task.schema_version == "1.4"
    assert task.environment.workdir == "/srv/app"
    assert task.environment.cpus == 0.5
    assert task.network["environment"] == NetworkPolicy("public")
    # allowed_hosts without a mode means allowlist; normalised and deduplicated.
    assert task.network["agent"] == NetworkPolicy(
        "allowlist", ("pypi.org", "files.pythonhosted.org")
    )
    assert task.network["verifier"] == NetworkPolicy("no-network")
    assert task.agent_user == "1000"  # a uid is accepted
    assert task.verifier_user == "root"
    assert [(h.command, h.user, h.timeout_sec, h.service) for h in task.collect] == [
        ("cp /var/log/app.log /logs/artifacts/", None, 10.0, None),
        ("true", "agent", None, "main"),
    ]


def test_allow_internet_false_is_no_network(tmp_path: Path) -> None:
    toml = 'schema_version = "1.1"\n[environment]\nallow_internet = false\n[agent]\nnetwork_mode = "public"\n'
    task = load_task(make_task(tmp_path, "t", toml))
    assert task.network["environment"] == NetworkPolicy("no-network")
    assert task.network["verifier"] == NetworkPolicy("no-network")  # inherits the baseline
    assert task.network["agent"] == NetworkPolicy("public")  # its own, for the agent phase


def test_network_mode_wins_over_allow_internet(tmp_path: Path) -> None:
    toml = '[environment]\nallow_internet = true\nnetwork_mode = "no-network"\n'
    assert load_task(make_task(tmp_path, "t", toml)).network["agent"].mode == "no-network"


def test_omitted_values_and_defaults(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "bare", ""))
    assert task.schema_version == "1.0"  # no version key at all: the oldest
    env = task.environment
    assert (env.cpus, env.memory_mb, env.storage_mb, env.gpus, env.workdir) == (None,) * 5
    assert task.agent_timeout_sec is None
    assert task.verifier_timeout_sec == DEFAULT_VERIFIER_TIMEOUT_SECONDS
    assert env.build_timeout_sec == DEFAULT_BUILD_TIMEOUT_SECONDS
    assert task.category == "uncategorized"
    assert task.agent_user is None and task.verifier_user is None
    assert task.collect == ()
    assert task.solution_dir == tmp_path / "bare" / "solution"
    assert task.test_script == tmp_path / "bare" / "tests" / "test.sh"


def test_no_solution_is_loaded_without_one(tmp_path: Path) -> None:
    assert load_task(make_task(tmp_path, "t", solve_sh=None)).solution_dir is None


def test_later_minor_schema_loads(tmp_path: Path) -> None:
    assert load_task(make_task(tmp_path, "t", 'schema_version = "1.7"\n')).schema_version == "1.7"


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ('schema_version = "2.0"\n', r"schema_version '2.0' is not supported"),
        ("schema_version = true\n", r"schema_version must be a string"),
        ('[environment]\nmemory = "lots"\n', r"environment.memory must be a size like '2G'"),
        ("[environment]\nmemory_mb = 0\n", r"environment.memory_mb must be a positive integer"),
        ('[environment]\ncpus = "two"\n', r"environment.cpus must be a number"),
        ("[environment]\ncpus = -1\n", r"environment.cpus must be a positive number"),
        ("[environment]\ngpus = 1.5\n", r"environment.gpus must be an integer"),
        (
            '[environment]\nnetwork_mode = "bridge"\n',
            r"network_mode must be one of public, no-network, allowlist",
        ),
        (
            '[agent]\nnetwork_mode = "public"\nallowed_hosts = ["a.org"]\n',
            r"agent.allowed_hosts must be empty",
        ),
        ('[agent]\nallowed_hosts = ["https://a.org/x"]\n', r"hostnames"),
        ('[environment]\nallow_internet = "yes"\n', r"allow_internet must be true or false"),
        ('[environment]\nworkdir = "app"\n', r"workdir must be an absolute path"),
        ("[verifier]\ntimeout_sec = 0\n", r"verifier.timeout_sec must be a positive number"),
        ('[verifier.env]\n"BAD-NAME" = "x"\n', r"valid environment variable name"),
        (
            '[verifier]\ncollect = [{ user = "x" }]\n',
            r"verifier.collect\[0\].command must be a non-empty",
        ),
        ('environment = "x"\n', r"\[environment\] must be a table"),
        ('[[steps]]\nname = "one"\n', r"multi-step tasks"),
        ('[verifier.environment]\ndocker_image = "v:1"\n', r"separate verifier environments"),
        ("[agent]\nuser = [1]\n", r"agent.user must be a user name or uid"),
        # Values the sandbox would refuse at the first command: refused at load instead.
        ("[agent]\nuser = -2\n", r"agent.user must be a user name or uid"),
        ('[verifier]\nuser = "a b"\n', r"verifier.user must be a user name or uid"),
        ('[verifier.env]\nA = "x\\u0000y"\n', r"verifier.env.A must be a string without NUL"),
        ('[[verifier.collect]]\ncommand = "ls\\u0000"\n', r"command must be a non-empty shell"),
        ('[environment]\nworkdir = "/app\\u0000"\n', r"workdir must be an absolute path"),
        # The messages stay short whatever the value's size.
        (
            '[environment]\ncpus = "' + "x" * 5000 + '"\n',
            r"environment.cpus must be a number, got 'x{76}\.\.\. in task.toml$",
        ),
    ],
)
def test_invalid_fields_name_the_field(tmp_path: Path, toml: str, match: str) -> None:
    with pytest.raises(TaskError, match=match) as info:
        load_task(make_task(tmp_path, "broken", toml))
    assert info.value.task == "broken"
    assert str(info.value).startswith("task 'broken': ")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"instruction": None}, r"no instruction.md"),
        ({"instruction": "  \n"}, r"instruction.md is empty"),
        ({"test_sh": None}, r"no tests/test.sh"),
        ({"dockerfile": None}, r"no environment/Dockerfile and no \[environment\].docker_image"),
    ],
)
def test_missing_files(tmp_path: Path, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TaskError, match=match):
        load_task(make_task(tmp_path, "t", **kwargs))  # type: ignore[arg-type]


def test_integers_past_a_float_are_clamped_not_raised(tmp_path: Path) -> None:
    # A 400-digit integer raised OverflowError out of load_task (the whole load aborted).
    huge = "9" * 400
    toml = (
        f"[agent]\ntimeout_sec = {huge}\n[environment]\ncpus = {huge}\ngpus = {huge}\n"
        f"memory_mb = {huge}\n[[verifier.collect]]\ncommand = 'true'\ntimeout_sec = {huge}\n"
    )
    task = load_task(make_task(tmp_path, "t", toml))
    cap = TaskLimits()
    assert task.agent_timeout_sec == cap.agent_timeout_sec
    assert task.environment.cpus == cap.cpus and task.environment.gpus == cap.gpus
    assert task.environment.memory_mb == cap.memory_mb
    assert task.collect[0].timeout_sec == cap.verifier_timeout_sec
    assert len(task.clamped) == 5 and "agent.timeout_sec inf -> 14400" in task.clamped


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ("version = " + "9" * 5000 + "\n", r"task.toml is not valid TOML: Exceeds the limit"),
        ("[agent]\nuser = " + "9" * 5000 + "\n", r"task.toml is not valid TOML"),
        ("x = " + "[" * 100_000 + "\n", r"task.toml is not valid TOML: nested too deeply"),
    ],
)
def test_toml_the_parser_cannot_hold_is_task_invalid(tmp_path: Path, toml: str, match: str) -> None:
    # tomllib raises ValueError (over 4300 digits) and RecursionError, not TOMLDecodeError.
    make_task(tmp_path, "t", toml)
    make_task(tmp_path, "good")
    report = load_dataset(tmp_path)
    assert [t.name for t in report.tasks] == ["good"]
    assert [name for name, _ in report.invalid] == ["t"]
    assert re.match(match, report.invalid[0][1]) and len(report.invalid[0][1]) < 300


@pytest.mark.parametrize(
    "relative",
    ["task.toml", "instruction.md", "tests/test.sh", "environment/Dockerfile", "solution/solve.sh"],
)
def test_a_folder_where_a_file_belongs_is_task_invalid(tmp_path: Path, relative: str) -> None:
    # os.fdopen raised IsADirectoryError out of the load (and leaked the descriptor).
    folder = make_task(tmp_path, "t")
    (folder / relative).unlink()
    (folder / relative).mkdir()
    make_task(tmp_path, "good")
    report = load_dataset(tmp_path)
    assert [t.name for t in report.tasks] == ["good"]
    assert report.invalid == (("t", f"{relative} is not a regular file; refusing to read it"),)


def test_bad_toml_and_no_toml(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"task.toml is not valid TOML"):
        load_task(make_task(tmp_path, "t", "[environment\n"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match=r"no task.toml"):
        load_task(tmp_path / "empty")


def test_compose_environment_refused(tmp_path: Path) -> None:
    folder = make_task(tmp_path, "t")
    (folder / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(TaskError, match=r"docker-compose environments are not supported"):
        load_task(folder)


def test_non_utf8_instruction(tmp_path: Path) -> None:
    folder = make_task(tmp_path, "t")
    (folder / "instruction.md").write_bytes(b"\xff\xfe bad")
    with pytest.raises(TaskError, match=r"instruction.md is not UTF-8"):
        load_task(folder)


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("2G", 2048),
        ("512M", 512),
        ("1.5g", 1536),
        ("2Gi", 2048),
        ("2GB", 2048),
        (" 4096 M ", 4096),
        ("1T", 1048576),
        ("2048K", 2),
        (300, 300),
    ],
)
def test_parse_size_mb(text: str | int, mb: int) -> None:
    assert parse_size_mb(text) == mb


@pytest.mark.parametrize("text", ["lots", "2X", "-1G", "2048", "", "0G", "1K", True])
def test_parse_size_mb_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size must"):
        parse_size_mb(text)


def test_dockerfile_base_images_skip_stages_and_comments() -> None:
    text = (
        "# FROM commented:out\n"
        "FROM --platform=linux/amd64 golang:1.22 AS build\n"
        "RUN go build ./...\n"
        "FROM build AS test\n"
        "from hermes-async-base:bookworm\n"
        "COPY --from=build /out /out\n"
    )
    assert dockerfile_base_images(text) == ("golang:1.22", "hermes-async-base:bookworm")


def test_network_reasons() -> None:
    dockerfile = (
        "FROM hermes-async-base:bookworm\n"
        "RUN apt-get update && \\\n    apt-get install -y curl\n"
        "# RUN pip install commented-out\n"
        "COPY x /x\n"
    )
    test_sh = (
        "#!/bin/bash\n"
        "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\n"
        "uvx -p 3.13 -w pytest==8.4.1 pytest /tests/test_outputs.py\n"
        "git clone https://example.com/x\n"
    )
    reasons = network_reasons(dockerfile_text=dockerfile, docker_image=None, test_sh_text=test_sh)
    assert reasons == (
        "Dockerfile RUN installs OS packages",
        "tests/test.sh downloads (curl/wget)",
        "tests/test.sh runs uv (downloads)",
        "tests/test.sh fetches a git repository",
    )
    offline = network_reasons(
        dockerfile_text="FROM hermes-async-base:bookworm\nRUN git init -q /app && useradd x\n",
        docker_image="ignored:when-a-dockerfile-exists",
        test_sh_text="python3 -m pytest /tests -rA && echo 1 > /logs/verifier/reward.txt\n",
    )
    assert offline == ()
    assert network_reasons(
        dockerfile_text="FROM debian:bookworm\n", docker_image=None, test_sh_text=None
    ) == ("Dockerfile builds FROM 'debian:bookworm' (pulled from a registry)",)
    assert (
        network_reasons(
            dockerfile_text="FROM my/own:1\n",
            docker_image=None,
            test_sh_text=None,
            local_images=frozenset({"my/own:1"}),
        )
        == ()
    )

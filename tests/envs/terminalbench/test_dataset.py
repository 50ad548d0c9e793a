"""load_dataset over folders (invalid tasks reported, never fatal) and select()."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_async.envs.terminalbench import (
    BASE_IMAGE,
    BUNDLED_FIXTURES,
    BUNDLED_TASKS,
    load_dataset,
    select,
)
from hermes_async.envs.terminalbench.dataset import parse_names
from hermes_async.envs.terminalbench.expect import is_negative_fixture
from hermes_async.errors import ConfigError
from tests.envs.terminalbench.helpers import make_task


def test_directory_of_tasks_reports_invalid_ones(tmp_path: Path) -> None:
    make_task(tmp_path, "b-good", 'schema_version = "1.1"\n[metadata]\ncategory = "x"\n')
    make_task(tmp_path, "a-good", 'version = "1.0"\n')
    make_task(tmp_path, "c-bad-size", '[environment]\nmemory = "plenty"\n')
    make_task(tmp_path, "d-no-test", test_sh=None)
    (tmp_path / "notes").mkdir()  # not a task at all: passed over
    (tmp_path / "notes" / "README.md").write_text("hi")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "stray-file.txt").write_text("x")
    report = load_dataset(tmp_path)
    assert [t.name for t in report.tasks] == ["a-good", "b-good"]
    assert report.invalid == (
        (
            "c-bad-size",
            "environment.memory must be a size like '2G' (or use memory_mb = <MB>), got 'plenty' in task.toml",
        ),
        ("d-no-test", "no tests/test.sh (the verifier entry point)"),
    )
    assert report.source == tmp_path
    text = report.describe()
    assert text.startswith(f"2 task(s) loaded from {tmp_path}, 2 invalid")
    assert "invalid d-no-test: no tests/test.sh" in text


def test_one_task_folder(tmp_path: Path) -> None:
    folder = make_task(tmp_path, "solo")
    report = load_dataset(folder)
    assert [t.name for t in report.tasks] == ["solo"]


def test_one_invalid_task_folder_is_reported(tmp_path: Path) -> None:
    folder = make_task(tmp_path, "solo", 'schema_version = "9"\n')
    report = load_dataset(folder)
    assert report.tasks == ()
    assert report.invalid[0][0] == "solo"


def test_missing_dataset_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"dataset '.*nope' does not exist; give a task folder"):
        load_dataset(tmp_path / "nope")


def test_network_needing_tasks_are_loaded_and_flagged(tmp_path: Path) -> None:
    make_task(tmp_path, "online", test_sh="#!/bin/bash\npip install pytest\n")
    make_task(tmp_path, "offline")
    report = load_dataset(tmp_path)
    assert [t.name for t in report.offline] == ["offline"]
    assert "needs network online: tests/test.sh pip-installs" in report.describe()


@pytest.mark.parametrize(
    ("names", "want"),
    [
        (None, ()),
        ("", ()),
        ("a", ("a",)),
        (" a, b,,a ,c ", ("a", "b", "c")),
        (["x", " y "], ("x", "y")),
    ],
)
def test_parse_names(names: object, want: tuple[str, ...]) -> None:
    assert parse_names(names) == want  # type: ignore[arg-type]


def test_select_exactly_the_named_tasks(tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d"):
        make_task(tmp_path, name)
    tasks = load_dataset(tmp_path).tasks
    assert [t.name for t in select(tasks).tasks] == ["a", "b", "c", "d"]
    chosen = select(tasks, task_filter="d,b")
    assert [t.name for t in chosen.tasks] == ["b", "d"]  # dataset order
    assert chosen.unknown == ()
    assert [t.name for t in select(tasks, skip_tasks="a, c").tasks] == ["b", "d"]
    both = select(tasks, task_filter="a,b,c", skip_tasks="b")
    assert [t.name for t in both.tasks] == ["a", "c"]
    typo = select(tasks, task_filter="a,bb", skip_tasks="zz")
    assert [t.name for t in typo.tasks] == ["a"]
    assert typo.unknown == ("bb", "zz")
    # Exact names only: no prefixes, no globs, case matters.
    assert select(tasks, task_filter="A,b*").tasks == ()


def test_bundled_tasks() -> None:
    report = load_dataset(BUNDLED_TASKS)
    assert report.invalid == ()
    assert len(report.tasks) == 11
    assert {t.schema_version for t in report.tasks} == {"1.0", "1.1", "1.3", "1.4"}
    for task in report.tasks:
        assert not task.needs_network, (task.name, task.network_reasons)
        assert task.environment.base_images == (BASE_IMAGE,), task.name
        assert task.solution_dir is not None, task.name
        assert not is_negative_fixture(task), task.name
        assert task.verifier_timeout_sec <= 120, task.name  # CI-sized
    by_name = report.by_name
    # The features the set is meant to cover are really declared.
    assert by_name["nonroot-user"].agent_user == "agent"
    assert by_name["custom-workdir"].environment.workdir == "/srv/work"
    assert dict(by_name["env-config"].solution_env) == {"ORACLE_MARKER": "solution-env-applied"}
    assert dict(by_name["env-config"].verifier_env) == {"EXPECTED_MODE": "staging"}
    assert dict(by_name["env-config"].environment.env) == {"APP_MODE": "staging"}
    assert (by_name["sales-summary"].tests_dir / "grade.py").is_file()


def test_bundled_fixtures_declare_their_outcome() -> None:
    report = load_dataset(BUNDLED_FIXTURES)
    assert report.invalid == ()
    assert sorted(t.name for t in report.tasks) == [
        "hygiene-daemon",
        "hygiene-plant",
        "no-reward",
        "verifier-timeout",
    ]
    for task in report.tasks:
        assert is_negative_fixture(task)
        assert "expect_status" in task.metadata
    assert report.by_name["verifier-timeout"].verifier_timeout_sec == 3.0


def test_a_fixture_with_an_unknown_expected_status_is_refused(tmp_path: Path) -> None:
    from hermes_async.envs.terminalbench.expect import expectation_for

    toml = '[metadata]\ntags = ["negative"]\nexpect_status = "fine"\n'
    task = load_dataset(make_task(tmp_path, "odd", toml)).tasks[0]
    with pytest.raises(ValueError, match=r"expect_status 'fine' is not one of ok, model"):
        expectation_for(task, "oracle")
    assert expectation_for(task, "null") is None


def test_registry_resolves_names_to_local_folders(tmp_path: Path) -> None:
    import subprocess

    from hermes_async.envs.terminalbench import resolve_dataset

    folder = tmp_path / "tb2"
    folder.mkdir()
    repo = tmp_path / "checkout"
    (repo / "tasks").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
         "--allow-empty", "-m", "x"],
        check=True,
    )  # fmt: skip
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    registry = tmp_path / "datasets.toml"
    registry.write_text(
        f'[datasets."terminal-bench@2.0"]\npath = "{folder}"\n'
        f'[datasets."mine@1"]\ngit = "{repo}"\ncommit = "{head}"\nsubdir = "tasks"\n'
        f'[datasets."old@1"]\ngit = "{repo}"\ncommit = "{"0" * 40}"\n'
    )
    assert resolve_dataset("terminal-bench@2.0", registry=registry) == folder
    assert resolve_dataset("terminal-bench", registry=registry) == folder  # one version
    assert resolve_dataset("mine@1", registry=registry) == repo / "tasks"
    assert resolve_dataset(str(folder), registry=registry) == folder  # a path wins
    with pytest.raises(ConfigError, match=r"'old@1': .* is at commit .*, the registry pins 0000"):
        resolve_dataset("old@1", registry=registry)
    with pytest.raises(ConfigError, match=r"'nope@1' is not in the registry .*registered: mine@1"):
        resolve_dataset("nope@1", registry=registry)
    with pytest.raises(ConfigError, match=r"neither a path nor in a registry"):
        resolve_dataset("x@1", registry=tmp_path / "missing.toml")


def test_image_map_and_offline_reasons(tmp_path: Path) -> None:
    from hermes_async.envs.terminalbench.images import (
        offline_reasons,
        parse_image_map,
        standin_notes,
        task_sandbox_spec,
    )

    mapping_file = tmp_path / "map.txt"
    mapping_file.write_text("# mirrors\npython:3.12-slim = local/python:3.12\nubuntu:24.04 u24\n")
    assert parse_image_map("a=b,c=d", mapping_file) == {
        "python:3.12-slim": "local/python:3.12",
        "ubuntu:24.04": "u24",
        "a": "b",
        "c": "d",
    }
    with pytest.raises(ConfigError, match=r"write FROM_IMAGE=LOCAL_IMAGE"):
        parse_image_map("lonely")
    from hermes_async.envs.terminalbench import load_task

    folder = make_task(
        tmp_path,
        "py",
        dockerfile="FROM python:3.12-slim\nRUN pip install numpy\n",
        test_sh="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    )
    task = load_task(folder)
    mapping = {"python:3.12-slim": "local/python:3.12"}
    absent = {"local/python:3.12": None}
    standin = {"local/python:3.12": {"hermes-async.standin": "Debian trixie, python 3.13"}}
    assert offline_reasons(task, absent, mapping) == (
        "Dockerfile RUN pip-installs",
        "image 'local/python:3.12' is not on the engine (pulling needs a registry)",
    )
    assert offline_reasons(task, standin, mapping, build_network=True) == ()
    assert standin_notes(task, standin, mapping) == (
        "stand-in local/python:3.12: Debian trixie, python 3.13",
    )
    spec = task_sandbox_spec(task, image_map=mapping)
    assert spec.image_map == mapping and spec.network_mode == "none"
    assert task_sandbox_spec(task, network=True).network_mode is None  # the config's


def test_a_folder_name_that_is_not_utf8_is_task_invalid(tmp_path: Path) -> None:
    # The name loaded as a lone surrogate; writing its row raised UnicodeEncodeError later.
    import os

    good = make_task(tmp_path, "good")
    os.rename(good, os.fsencode(tmp_path) + b"/bad\xff")
    make_task(tmp_path, "good")
    report = load_dataset(tmp_path)
    assert [t.name for t in report.tasks] == ["good"]
    assert report.invalid == (("bad\\udcff", "the folder name is not UTF-8; rename the folder"),)
    report.describe().encode("utf-8")  # printable as it is


def test_a_null_floor_or_expected_reward_past_a_float_is_refused(tmp_path: Path) -> None:
    from hermes_async.envs.terminalbench.expect import expectation_for

    huge = "9" * 400
    task = load_dataset(make_task(tmp_path, "floor", f"[metadata]\nnull_floor = {huge}\n")).tasks[0]
    with pytest.raises(ValueError, match=r"\[metadata\].null_floor 999.* is not a finite number"):
        expectation_for(task, "null")
    toml = f'[metadata]\ntags = ["negative"]\nexpect_reward = {huge}\n'
    task = load_dataset(make_task(tmp_path, "fixture", toml)).tasks[0]
    with pytest.raises(ValueError, match=r"expect_reward 999.* is not a finite number"):
        expectation_for(task, "oracle")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"\xff\xfe", r"cannot read the dataset registry .*: 'utf-8' codec can't decode"),
        (b"x = " + b"9" * 5000, r"cannot read the dataset registry .*: Exceeds the limit"),
        (b"x = " + b"[" * 100_000, r"cannot read the dataset registry .*: nested too deeply"),
        (b'[datasets."tb@2"]\npath = "a\\u0000b"\n', r"path must be a string without NUL"),
        (b'[datasets."tb@2"]\npath = "."\ncommit = 5\n', r"commit must be a string"),
        (b'[datasets."tb@2"]\npath = "."\nsubdir = 5\n', r"subdir must be a string"),
        (b"[datasets]\n" + b"x = 1\n" * 200_000, r"dataset registry .* is larger than 1 MiB"),
    ],
)
def test_a_damaged_registry_is_a_config_error(tmp_path: Path, content: bytes, match: str) -> None:
    # Each raised UnicodeDecodeError, ValueError or RecursionError; a commit or subdir of the
    # wrong type was ignored (the pin silently unchecked).
    from hermes_async.envs.terminalbench import resolve_dataset

    registry = tmp_path / "datasets.toml"
    registry.write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        resolve_dataset("tb@2", registry=registry)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b'{"a": ', r"image map file .* is not JSON \(Expecting value"),
        (b'{"a": ' + b"[" * 100_000, r"image map file .* is not JSON \(nested too deeply"),
        (b"a=\xff\n", r"image map file .* is not UTF-8 text"),
        (b"a=b\n" * 300_000, r"image map file .* is larger than 1 MiB"),
    ],
)
def test_a_damaged_image_map_file_is_a_config_error(
    tmp_path: Path, content: bytes, match: str
) -> None:
    from hermes_async.envs.terminalbench.images import parse_image_map

    path = tmp_path / "map"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        parse_image_map(None, path)

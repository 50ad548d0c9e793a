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
    assert len(report.tasks) == 10
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

"""Which image a task runs on: the image map, stand-in images, and the task's SandboxSpec.

Offline, ``FROM python:3.12-slim`` builds only on an image the engine has: loaded, mapped
(``--env.image_map a=b``), or a stand-in from ``scripts/docker/standin_images.sh``.
Stand-ins carry :data:`STANDIN_LABEL` and a trial on one says so. :func:`offline_reasons`
flags what a task would fetch, before anything runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from hermes_async._json import decode_problem
from hermes_async.envs.terminalbench.files import read_head
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "STANDIN_LABEL",
    "machine_cpus",
    "offline_reasons",
    "parse_image_map",
    "standin_notes",
    "task_images",
    "task_sandbox_spec",
)

#: Label of a stand-in image; its value says what the image really is.
STANDIN_LABEL = "hermes-async.standin"
#: Largest image-map file read.
_MAX_MAP_FILE_BYTES = 1 << 20


def _pairs(text: str, where: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for raw in text.replace(",", "\n").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, target = line.partition("=")
        if not sep:
            name, _, target = line.partition(" ")
        name, target = name.strip(), target.strip()
        if not name or not target or any(c.isspace() for c in name + target):
            raise ConfigError(
                f"image map entry {raw.strip()!r} in {where}: write FROM_IMAGE=LOCAL_IMAGE"
            )
        mapping[name] = target
    return mapping


def parse_image_map(text: str | None = None, file: str | Path | None = None) -> dict[str, str]:
    """The image map: ``file`` (JSON, or ``a=b`` lines), then ``text`` (``a=b,c=d``) on top.

    Raises:
        ConfigError: An entry that is not ``name=image``, or an unreadable file.
    """
    mapping: dict[str, str] = {}
    if file is not None:
        path = Path(file)
        try:
            data = read_head(path, _MAX_MAP_FILE_BYTES + 1)
            if len(data) > _MAX_MAP_FILE_BYTES:
                raise ConfigError(f"image map file {str(path)!r} is larger than 1 MiB")
        except OSError as exc:
            raise ConfigError(f"cannot read image map file {str(path)!r}: {exc}") from None
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"image map file {str(path)!r} is not UTF-8 text") from None
        if content.lstrip().startswith("{"):
            try:
                loaded = json.loads(content)
            except (ValueError, RecursionError) as exc:
                reason = decode_problem(exc)
                raise ConfigError(
                    f"image map file {str(path)!r} is not JSON ({reason}); want an object of "
                    "strings, or FROM_IMAGE=LOCAL_IMAGE lines"
                ) from None
            if not isinstance(loaded, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()
            ):
                raise ConfigError(f"image map file {str(path)!r}: want an object of strings")
            mapping.update(loaded)
        else:
            mapping.update(_pairs(content, repr(str(path))))
    if text:
        mapping.update(_pairs(text, "image_map"))
    return mapping


def task_images(task: HarborTask, image_map: Mapping[str, str]) -> tuple[str, ...]:
    """The images a task's build or run needs from the engine, after the map."""
    env = task.environment
    if env.dockerfile is None:
        image = env.docker_image or ""
        return (image_map.get(image, image),)
    mapped = (image_map.get(image, image) for image in env.base_images)
    return tuple(dict.fromkeys(i for i in mapped if i.lower() != "scratch"))


def offline_reasons(
    task: HarborTask,
    present: Mapping[str, Mapping[str, str] | None],
    image_map: Mapping[str, str],
    *,
    build_network: bool = False,
) -> tuple[str, ...]:
    """Why the task would need the network here (empty: it runs offline).

    ``present`` maps each of :func:`task_images` to its labels (None: absent). A present
    ``docker_image`` needs no build, and ``build_network`` lets builds fetch: their reasons
    drop out; the verifier's stay.
    """
    env = task.environment
    prebuilt = env.docker_image is not None and (
        present.get(image_map.get(env.docker_image, env.docker_image)) is not None
    )
    reasons = []
    for reason in task.network_reasons:
        if reason.startswith("tests/test.sh") or (
            not prebuilt and not build_network and reason.startswith("Dockerfile RUN")
        ):
            reasons.append(reason)
    if not prebuilt:
        for image in task_images(task, image_map):
            if present.get(image) is None:
                reasons.append(f"image {image!r} is not on the engine (pulling needs a registry)")
    return tuple(reasons)


def standin_notes(
    task: HarborTask,
    present: Mapping[str, Mapping[str, str] | None],
    image_map: Mapping[str, str],
) -> tuple[str, ...]:
    """One note per stand-in image the task runs on (``"stand-in python:3.12-slim: ..."``)."""
    notes = []
    for image in task_images(task, image_map):
        labels = present.get(image) or {}
        if STANDIN_LABEL in labels:
            notes.append(f"stand-in {image}: {labels[STANDIN_LABEL]}")
    return tuple(notes)


def machine_cpus(task: HarborTask) -> float | None:
    """The task's ``cpus`` within this machine's CPU count (the engine refuses more)."""
    cpus = task.environment.cpus
    return None if cpus is None else min(cpus, float(os.cpu_count() or 1))


def task_sandbox_spec(
    task: HarborTask, *, network: bool = False, image_map: Mapping[str, str] | None = None
) -> SandboxSpec:
    """The task's :class:`SandboxSpec`: build context or image, resources, workdir, env, deadline.

    Args:
        network: Leave the network to the sandbox configuration unless the task says
            ``no-network``; default: none.
    """
    env = task.environment
    policy = task.network.get("environment")
    configured = network and (policy is None or policy.mode != "no-network")
    return SandboxSpec(
        image=env.docker_image,
        build_context=env.build_context,
        image_map=dict(image_map or {}),
        build_timeout=env.build_timeout_sec,
        cpus=machine_cpus(task),
        memory_mb=env.memory_mb,
        storage_mb=env.storage_mb,
        network_mode=None if configured else "none",
        workdir=env.workdir,
        env=dict(env.env),
        labels={"hermes-async.terminalbench.task": task.name},
    )

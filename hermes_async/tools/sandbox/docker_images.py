"""Images for per-item Docker sandboxes: built from a context once per content, behind a limiter.

The tag is ``<repository>:<digest>`` of the context's files, its ``FROM`` image ids and any
image map, so an unchanged context is never rebuilt; concurrent requests share one build. The
context is streamed from a temporary tar, never held in memory. asyncio only (aiodocker).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import anyio

from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.errors import TransferLimitError
from hermes_async.tools.sandbox.transfer import pack_host_tree

__all__ = (
    "DEFAULT_BUILD_REPOSITORY",
    "BuiltImage",
    "ImageBuilder",
    "context_digest",
    "dockerfile_base_images",
    "dockerfile_lines",
    "map_base_images",
)

logger = logging.getLogger(__name__)

#: Repository of built images (the tag is the context digest).
DEFAULT_BUILD_REPOSITORY = "hermes-async-build"
#: Largest build context streamed to the engine (compressed).
MAX_BUILD_CONTEXT_BYTES = 1 << 30

_T = TypeVar("_T")


class _Engine(Protocol):
    """What the builder needs of the Docker backend's engine (``docker._Engine``)."""

    client: Any

    async def call(self, what: str, awaitable: Awaitable[_T], timeout: float | None = None) -> _T:
        """Await an engine call within its deadline."""
        ...

    def is_docker_error(self, exc: BaseException, *statuses: int) -> bool:
        """Whether ``exc`` is aiodocker's error (with one of ``statuses``)."""
        ...


_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE)


def dockerfile_lines(text: str) -> list[str]:
    """A Dockerfile's logical lines: comments dropped, backslash continuations joined."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current:
            lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def dockerfile_base_images(text: str) -> tuple[str, ...]:
    """The images a Dockerfile builds on, build-stage names excluded, in order."""
    stages: set[str] = set()
    images: list[str] = []
    for line in dockerfile_lines(text):
        match = _FROM.match(line)
        if match is None:
            continue
        image, alias = match.group(1), match.group(2)
        if image.lower() not in stages and image not in images:
            images.append(image)
        if alias:
            stages.add(alias.lower())
    return tuple(images)


def map_base_images(text: str, image_map: Mapping[str, str]) -> str:
    """``text`` (a Dockerfile) with each ``FROM`` image named in ``image_map`` replaced."""
    if not image_map:
        return text

    def swap(match: re.Match[str]) -> str:
        image = match.group(2)
        return match.group(1) + image_map.get(image, image) + match.group(3)

    pattern = re.compile(r"^(\s*FROM\s+(?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE)
    return pattern.sub(swap, text)


def context_digest(context: Path, base_ids: Sequence[str] = ()) -> str:
    """A hash of a build context (every path, its executable bit, content or link target)
    and of the ids of the images it builds on (a rebuilt base image means a new tag)."""
    h = hashlib.sha256()
    for base in base_ids:
        h.update(b"B" + base.encode() + b"\0")
    for path in sorted(context.rglob("*")):
        rel = path.relative_to(context).as_posix()
        if path.is_symlink():
            h.update(b"L" + rel.encode() + b"\0" + os.readlink(path).encode() + b"\0")
        elif path.is_file():
            mode = b"x" if os.access(path, os.X_OK) else b"-"
            h.update(b"F" + mode + rel.encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
        elif path.is_dir():
            h.update(b"D" + rel.encode() + b"\0")
    return h.hexdigest()[:16]


async def _build_on_network(
    engine: _Engine, body: BinaryIO, tag: str, labels: Mapping[str, str], network: str
) -> Any:
    """``POST /build`` with ``networkmode`` (aiodocker's ``build`` has no such argument, so
    this goes through its request and response helpers; the lock file pins aiodocker)."""
    import aiohttp

    images = engine.client.images
    params = {
        "t": tag,
        "rm": "1",
        "forcerm": "1",
        "networkmode": network,
        "labels": json.dumps(dict(labels)),
    }
    response = engine.client._query(
        "build",
        "POST",
        params=params,
        headers={"content-type": "application/x-tar", "Content-Encoding": "gzip"},
        data=images._stream(body),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
    )
    return await images._handle_list(response)


def _write_dockerfile(tmp: str, text: str) -> str:
    """Write ``text`` as ``<tmp>/mapped/Dockerfile`` (a few KB); return the folder."""
    folder = Path(tmp, "mapped")
    folder.mkdir()
    (folder / "Dockerfile").write_text(text, encoding="utf-8")
    return str(folder)


class BuiltImage:
    """An image ready to run: its tag and its ``WORKDIR`` (``None``: the image sets none)."""

    __slots__ = ("built", "tag", "workdir")

    def __init__(self, tag: str, workdir: str | None, *, built: bool) -> None:
        self.tag = tag
        self.workdir = workdir
        self.built = built

    def __repr__(self) -> str:
        return f"BuiltImage({self.tag!r}, workdir={self.workdir!r}, built={self.built})"


class ImageBuilder:
    """Builds context folders into images, once per content digest, behind :attr:`limiter`.

    ``build_concurrency`` sizes the limiter; ``build_network`` is the network of ``RUN`` steps.
    :attr:`builds` counts images built, not found cached.
    """

    def __init__(
        self,
        *,
        build_concurrency: int = 1,
        repository: str = DEFAULT_BUILD_REPOSITORY,
        build_network: str | None = None,
    ) -> None:
        self.limiter = anyio.CapacityLimiter(build_concurrency)
        self.repository = repository
        self.build_network = build_network
        self.builds = 0
        self._locks: dict[str, anyio.Lock] = {}

    async def _image(self, engine: _Engine, name: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = await engine.call(
                f"an inspect of image {name}", engine.client.images.inspect(name)
            )
        except Exception as exc:
            if engine.is_docker_error(exc, 404):
                return None
            raise
        return info

    async def labels_of(self, engine: _Engine, image: str) -> dict[str, str] | None:
        """The image's labels, ``None`` when the engine lacks it.

        **Cancellation**: nothing to clean up.
        """
        info = await self._image(engine, image)
        if info is None:
            return None
        return dict((info.get("Config") or {}).get("Labels") or {})

    async def has(self, engine: _Engine, image: str) -> bool:
        """Whether the engine has ``image``.

        **Cancellation**: nothing to clean up.
        """
        return await self._image(engine, image) is not None

    async def workdir_of(self, engine: _Engine, image: str) -> str | None:
        """The image's ``WORKDIR``, or ``None``.

        **Cancellation**: nothing to clean up.
        """
        info = await self._image(engine, image)
        if info is None:
            return None
        return (info.get("Config") or {}).get("WorkingDir") or None

    async def ensure(
        self,
        engine: _Engine,
        context: Path,
        *,
        timeout: float,
        image_map: Mapping[str, str] | None = None,
    ) -> BuiltImage:
        """The image of ``context``: cached or built now (``image_map`` rewrites ``FROM``).

        Raises:
            SandboxError: The build failed, or ran past ``timeout``.

        **Cancellation**: the wait is abandoned; the engine may still finish and tag the build.
        """
        original = (context / "Dockerfile").read_text(encoding="utf-8", errors="replace")
        dockerfile = map_base_images(original, image_map or {})
        base_ids = [] if dockerfile == original else ["map:" + dockerfile]
        for base in dockerfile_base_images(dockerfile):
            info = await self._image(engine, base)
            base_ids.append(str(info["Id"]) if info else base)
        tag = f"{self.repository}:{context_digest(context, base_ids)}"
        lock = self._locks.setdefault(tag, anyio.Lock())
        async with lock:
            info = await self._image(engine, tag)
            built = False
            if info is None:
                async with self.limiter:
                    await self._build(
                        engine,
                        context,
                        tag,
                        timeout,
                        None if dockerfile == original else dockerfile,
                    )
                self.builds += 1
                built = True
                info = await self._image(engine, tag)
                if info is None:
                    raise SandboxError(f"the engine built {tag} but does not show it afterwards")
        workdir = (info.get("Config") or {}).get("WorkingDir") or None
        return BuiltImage(tag, workdir, built=built)

    async def _build(
        self, engine: _Engine, context: Path, tag: str, timeout: float, dockerfile: str | None
    ) -> None:
        logger.info("building %s from %s", tag, context)
        with tempfile.TemporaryDirectory(prefix="hermes-build-") as tmp:
            archive = os.path.join(tmp, "context.tar.gz")
            replace_file = None
            if dockerfile is not None:
                replace_file = ("Dockerfile", _write_dockerfile(tmp, dockerfile))
            try:
                await pack_host_tree(
                    str(context),
                    archive,
                    max_bytes=MAX_BUILD_CONTEXT_BYTES,
                    gzip=True,
                    replace_file=replace_file,
                )
            except (OSError, TransferLimitError) as exc:
                raise SandboxError(f"cannot pack the build context {context}: {exc}") from exc
            # A local file's descriptor; aiohttp reads it in chunks as it sends.
            with open(archive, "rb") as body:  # noqa: ASYNC230
                messages = await self._send(engine, context, tag, timeout, body)
        errors = [
            str(m.get("error") or (m.get("errorDetail") or {}).get("message"))
            for m in messages or ()
            if isinstance(m, dict) and (m.get("error") or m.get("errorDetail"))
        ]
        if errors:
            raise SandboxError(f"building {context} failed: {errors[-1][-800:]}")

    async def _send(
        self, engine: _Engine, context: Path, tag: str, timeout: float, body: BinaryIO
    ) -> Any:
        labels = {"hermes-async.build-context": str(context)}
        try:
            if self.build_network is None:
                request = engine.client.images.build(
                    fileobj=body, encoding="gzip", tag=tag, rm=True, forcerm=True, labels=labels
                )
            else:
                request = _build_on_network(engine, body, tag, labels, self.build_network)
            return await engine.call(f"the build of {tag} from {context}", request, timeout=timeout)
        except SandboxError:
            raise
        except Exception as exc:
            if engine.is_docker_error(exc):
                raise SandboxError(f"the Docker engine refused to build {context}: {exc}") from exc
            raise

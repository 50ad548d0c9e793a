"""What a command line names: the model (``--model``), the environment (``ENV``), the oracle.

:func:`parse_model`, :func:`resolve_env` and :func:`resolve_oracle` turn each into what it
names. The API key comes from the provider's variable, never from the command line. Every
mistake is a :class:`~hermes_async.errors.ConfigError` naming the value and the fix.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from hermes_async._net import base_url_problem
from hermes_async.errors import ConfigError

__all__ = (
    "ENTRY_POINT_GROUP",
    "PROVIDERS",
    "ModelSpec",
    "did_you_mean",
    "load_object",
    "parse_model",
    "registered_environments",
    "resolve_env",
    "resolve_oracle",
    "syntax_problem",
)

#: Entry point group where installed packages register environments (name -> "module:Class").
ENTRY_POINT_GROUP = "hermes_async.environments"

#: The bundled environments, by their ``name``.
_BUNDLED = {
    "terminal_test": "hermes_async.envs.terminal_test:TerminalTestEnv",
    "coding": "hermes_async.envs.coding:CodingEnv",
    "terminalbench2": "hermes_async.envs.terminalbench:TerminalBench2EvalEnv",
    "swe": "hermes_async.envs.swe:HermesSweEnv",
    "tblite": "hermes_async.envs.tblite:TBLiteEvalEnv",
    "yc_bench": "hermes_async.envs.yc_bench:YCBenchEvalEnv",
    "web_research": "hermes_async.envs.web_research:WebResearchEnv",
}

Provider = Literal["vllm", "sglang", "openai"]

#: ``--model`` providers: ``(server_type, variable holding the API key, default URL)``.
PROVIDERS: dict[str, tuple[str, str, str]] = {
    "vllm": ("vllm", "VLLM_API_KEY", "http://127.0.0.1:8000"),
    "sglang": ("sglang", "SGLANG_API_KEY", "http://127.0.0.1:30000"),
    "openai": ("openai", "OPENAI_API_KEY", "https://api.openai.com"),
}


# ------------------------------------------------------------------------------------------
# the model


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A parsed ``--model PROVIDER/NAME[@URL]``; ``base_url`` ends in ``/v1``.

    ``vllm`` and ``sglang`` give exact tokens; ``openai`` is the chat path.
    """

    provider: Provider
    name: str
    base_url: str

    @property
    def token_server(self) -> bool:
        """Whether the server speaks tokens (Phase 2), so the tokenizer must be the model's."""
        return self.provider != "openai"

    def server_config(self) -> Any:
        """atroposlib's ``APIServerConfig``; the API key from the provider's variable
        (``VLLM_API_KEY``, ``SGLANG_API_KEY``, ``OPENAI_API_KEY``), else ``"x"``."""
        from hermes_async.envs._atropos import APIServerConfig

        server_type, key_variable, _ = PROVIDERS[self.provider]
        return APIServerConfig(
            base_url=self.base_url,
            model_name=self.name,
            server_type=server_type,
            api_key=os.environ.get(key_variable) or "x",
            health_check=False,
        )

    def __str__(self) -> str:
        from hermes_async._redact import redact_url

        return f"{self.provider}/{self.name}@{redact_url(self.base_url)}"


def parse_model(text: str) -> ModelSpec:
    """``vllm/Qwen/Qwen3-8B@http://host:8000`` -> :class:`ModelSpec`.

    The URL defaults to the provider's local port (``PROVIDERS``) and gets ``/v1`` appended.
    """
    shape = "PROVIDER/NAME[@URL], e.g. vllm/Qwen/Qwen3-8B@http://127.0.0.1:8000"
    provider, slash, rest = text.partition("/")
    name, _, url = rest.partition("@")
    if not slash or provider not in PROVIDERS:
        raise ConfigError(
            f"--model {text!r}: unknown provider {provider!r}; expected {shape} with PROVIDER "
            f"one of {', '.join(PROVIDERS)}"
        )
    if not name.strip():
        raise ConfigError(f"--model {text!r}: the model name is empty; expected {shape}")
    url = url.strip() or PROVIDERS[provider][2]
    if base_url_problem(url) is not None:
        raise ConfigError(
            f"--model {text!r}: the server URL {url!r} is not http(s)://host[:port]; "
            f"expected {shape}"
        )
    url = url.rstrip("/")
    if not url.endswith("/v1"):
        url += "/v1"
    return ModelSpec(provider, name.strip(), url)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# the environment and the oracle


def registered_environments() -> dict[str, str]:
    """Short names -> ``module:Class``: the bundled environments, then those installed packages
    register in the entry point group :data:`ENTRY_POINT_GROUP` (they may not shadow one)."""
    names = dict(_BUNDLED)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(entry.name, entry.value)
    return names


_FILES: dict[Path, ModuleType] = {}


def _load_file(path: Path) -> ModuleType:
    """Import a Python file once per process, as ``python file.py`` would see its folder."""
    path = path.resolve()
    if path in _FILES:
        return _FILES[path]
    name = path.stem if path.stem.isidentifier() else "_hermes_async_user_module"
    if name in sys.modules:  # another module has that name: keep ours apart
        name = f"_hermes_async_user_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {str(path)!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # its sibling modules, as `python file.py` has
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:  # also a file that is not UTF-8
        del sys.modules[name]
        raise ConfigError(f"cannot import {str(path)!r}: {syntax_problem(exc)}") from exc
    except BaseException:
        del sys.modules[name]
        raise
    _FILES[path] = module
    return module


def load_object(spec: str, *, what: str) -> tuple[ModuleType, Any]:
    """``path/to/file.py[:NAME]`` or ``module[:NAME]`` -> ``(module, the object or None)``.

    A file is imported once per process with its folder on ``sys.path``; a module with the
    working directory there, as ``python -m`` does.
    """
    target, colon, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if colon and (not name.isidentifier() or not target):
        raise ConfigError(f"{what} {spec!r}: expected FILE.py[:NAME] or MODULE[:NAME]")
    path = Path(target).expanduser()
    if target.endswith(".py") or os.sep in target:
        if not path.is_file():
            raise ConfigError(f"{what} {spec!r}: no such file {str(path)!r}")
        module = _load_file(path)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except SyntaxError as exc:
            raise ConfigError(
                f"{what} {spec!r}: cannot import {target!r}: {syntax_problem(exc)}"
            ) from exc
        except ModuleNotFoundError as exc:
            if exc.name is None or not target.startswith(exc.name):
                raise  # the module exists; something it imports does not
            raise ConfigError(
                f"{what} {spec!r}: no module named {target!r} (from {os.getcwd()}); give a "
                "file path (my_env.py) or an importable module (pkg.my_env:MyEnv)"
            ) from None
    if not name:
        return module, None
    if not hasattr(module, name):
        public = [n for n in vars(module) if not n.startswith("_")]
        raise ConfigError(
            f"{what} {spec!r}: {module.__name__} has no {name!r}{did_you_mean(name, public)}"
        )
    return module, getattr(module, name)


def syntax_problem(exc: SyntaxError) -> str:
    """``invalid syntax (line 3 of my_env.py)``: where to look, without the traceback."""
    where = f"line {exc.lineno} of " if exc.lineno else ""
    return f"{exc.msg} ({where}{exc.filename or 'the file'}); fix the file"


def did_you_mean(name: str, options: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``options``, or ``""``."""
    close = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def resolve_env(spec: str) -> type[Any]:
    """The environment class of a file, a ``module:Class`` or a registered short name."""
    from hermes_async.envs.base import HermesAgentBaseEnv

    registered = registered_environments()
    looks_like_path = spec.endswith(".py") or os.sep in spec or ":" in spec
    if spec in registered:
        spec = registered[spec]
    elif not looks_like_path and importlib.util.find_spec(spec.split(".")[0]) is None:
        raise ConfigError(
            f"unknown environment {spec!r}{did_you_mean(spec, list(registered))}; give a "
            f"file (my_env.py[:MyEnv]), a module (pkg.my_env:MyEnv) or a registered name: "
            f"{', '.join(sorted(registered))}"
        )
    module, found = load_object(spec, what="environment")
    if found is None:
        classes = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, HermesAgentBaseEnv)
            and obj.__module__ == module.__name__
        ]
        if len(classes) != 1:
            names = ", ".join(c.__name__ for c in classes) or "none"
            raise ConfigError(
                f"environment {spec!r}: expected one HermesAgentBaseEnv subclass defined in "
                f"{module.__name__}, found {names}; name it: {spec}:MyEnv"
            )
        found = classes[0]
    if not (isinstance(found, type) and issubclass(found, HermesAgentBaseEnv)):
        raise ConfigError(
            f"environment {spec!r} is {found!r}, not a subclass of "
            "hermes_async.envs.HermesAgentBaseEnv"
        )
    return found


def resolve_oracle(spec: str) -> Callable[[Any], str]:
    """The scripted policy ``FILE.py:NAME`` or ``MODULE:NAME`` names.

    A function ``(PolicyRequest) -> str``, or one without parameters that returns one.
    """
    if ":" not in spec:
        raise ConfigError(
            f"--oracle {spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION "
            "(a function (PolicyRequest) -> str)"
        )
    _, found = load_object(spec, what="--oracle")
    if not callable(found):
        raise ConfigError(f"--oracle {spec!r} is {found!r}, not a function")
    try:
        parameters = inspect.signature(found).parameters
    except (TypeError, ValueError):
        return found  # type: ignore[no-any-return]
    if not parameters:
        policy = found()  # a factory of policies
        if not callable(policy):
            raise ConfigError(
                f"--oracle {spec!r}: it takes no parameters, so it must return the policy "
                f"(a function (PolicyRequest) -> str), but returned {policy!r}"
            )
        return policy  # type: ignore[no-any-return]
    return found  # type: ignore[no-any-return]

"""Scripted policies for the benchmark environments: an oracle each, a null policy, a judge.

Each oracle solves its environment's built-in sample, so a run needs no model:
``hermes-async eval swe --oracle hermes_async.testing.benchmarks:swe_oracle``.
:func:`open_web_research_world` serves a fake web provider and the judge for offline runs
(``python -m hermes_async.testing.benchmarks web-research-world``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import re
import shlex
import sys
import tarfile
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from hermes_async.envs.samples import SWE_SAMPLE, TBLITE_SAMPLE, WEB_RESEARCH_SAMPLE
from hermes_async.jsontypes import JSONObject
from hermes_async.testing.fake_web import FakeWebProvider
from hermes_async.testing.http import open_loopback_server
from hermes_async.testing.scripted_server import PolicyRequest, ScriptedModelServer

__all__ = (
    "SampleWebProvider",
    "main",
    "null_policy",
    "open_web_research_world",
    "scripted_judge",
    "swe_oracle",
    "tblite_oracle",
    "web_research_oracle",
    "yc_bench_oracle",
)

Policy = Callable[[PolicyRequest], str]


def _tool_call(name: str, arguments: dict[str, Any]) -> str:
    # The hermes <tool_call> format the environments parse (one block per call).
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def _tool_results(request: PolicyRequest) -> list[str]:
    """The ``tool`` messages since the last ``user`` message: the oracle's progress."""
    start = 0
    for index, message in enumerate(request.messages):
        if message.get("role") == "user":
            start = index + 1
    return [
        str(m.get("content") or "") for m in request.messages[start:] if m.get("role") == "tool"
    ]


def _output(content: str) -> str:
    """A terminal result's ``output`` (the tool answers JSON), else the content itself."""
    try:
        data = json.loads(content)
    except ValueError:
        return content
    return str(data.get("output", content)) if isinstance(data, dict) else content


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def null_policy(request: PolicyRequest) -> str:
    """Answer at once, with no tool call."""
    del request
    return "I cannot help with that."


def swe_oracle(path: Path = SWE_SAMPLE) -> Policy:
    """HermesSweEnv's oracle for rows with a ``canonical_solution``: write it, run it, answer."""
    rows = [r for r in _rows(path) if r.get("canonical_solution")]

    def policy(request: PolicyRequest) -> str:
        text = request.last_user_text
        row = next((r for r in rows if str(r["prompt"]) in text), None)
        if row is None:
            return "I do not know this task."
        match = re.search(r"Save your solution as (\S+) in the working directory", text)
        path = match.group(1) if match else "solution.py"
        done = _tool_results(request)
        if not done:
            source = str(row["prompt"]) + str(row["canonical_solution"])
            return _tool_call("write_file", {"path": path, "content": source})
        if len(done) == 1:
            return _tool_call("terminal", {"command": f"python3 {path} && echo compiled"})
        return f"{row['entry_point']} is written to {path}."

    return policy


def _solve_script(solution_tar: str) -> str | None:
    """``solve.sh`` out of a row's ``solution_tar`` (base64 of a tar.gz)."""
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(solution_tar)), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.rsplit("/", 1)[-1] == "solve.sh":
                data = tar.extractfile(member)
                return data.read().decode() if data is not None else None
    return None


def tblite_oracle(path: Path = TBLITE_SAMPLE) -> Policy:
    """TBLiteEvalEnv's oracle for rows with a ``solution_tar``: run ``solve.sh``, answer."""
    scripts = {
        str(row["instruction"]).strip(): script
        for row in _rows(path)
        if row.get("solution_tar") and (script := _solve_script(str(row["solution_tar"])))
    }

    def policy(request: PolicyRequest) -> str:
        script = scripts.get(request.last_user_text.strip())
        if script is None:
            return "I do not know this task."
        if not _tool_results(request):
            return _tool_call("terminal", {"command": f"bash -c {shlex.quote(script)}"})
        return "Done: the task's steps ran."

    return policy


def yc_bench_oracle() -> Policy:
    """YCBenchEvalEnv's oracle for its built-in world (``--env.presets '["sample"]'``).

    Takes the two best-paid prestige-1 tasks, puts every employee on both, dispatches them and
    resumes time once; the two tasks carry the sample's payroll for the rest of the year.
    """
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

    def policy(request: PolicyRequest) -> str:
        if "YC-Bench simulation" not in request.last_user_text:
            return "I do not know this task."
        done = _tool_results(request)
        if not done:
            look = (
                "yc-bench company status && yc-bench employee list && "
                "yc-bench market browse --required-prestige-lte 1 --limit 2"
            )
            return _tool_call("terminal", {"command": look})
        if len(done) == 1:
            seen = _output(done[0])
            people = re.findall(rf'"employee_id": "({uuid})"', seen)
            tasks = re.findall(rf'"task_id": "({uuid})"', seen)[:2]
            steps = [f"yc-bench task accept --task-id {t}" for t in tasks]
            steps += [
                f"yc-bench task assign --task-id {t} --employee-id {e}"
                for t in tasks
                for e in people
            ]
            steps += [f"yc-bench task dispatch --task-id {t}" for t in tasks]
            return _tool_call("terminal", {"command": " && ".join(steps) or "true"})
        if len(done) == 2:
            return _tool_call("terminal", {"command": "yc-bench sim resume"})
        return "Two tasks are under way with the whole team; time can run to the horizon."

    return policy


# ------------------------------------------------------------------------------------------
# WebResearchEnv


def _frames_rows(path: Path) -> list[tuple[str, str, list[str]]]:
    """``(question, answer, wikipedia links)`` of FRAMES-shaped rows."""
    out = []
    for row in _rows(path):
        links = [str(v) for k, v in sorted(row.items()) if k.startswith("wikipedia_link") and v]
        out.append((str(row["Prompt"]), str(row["Answer"]), links))
    return out


@dataclass
class SampleWebProvider(FakeWebProvider):
    """A fake search provider that knows the sample's questions.

    Their searches return the Wikipedia pages and a page on a second domain, each snippet
    stating the answer; any other query gets the default results.
    """

    by_query: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)

    @classmethod
    def for_sample(cls, path: Path = WEB_RESEARCH_SAMPLE, **kwargs: Any) -> SampleWebProvider:
        """One provider (Tavily's API by default) for the rows of ``path``."""
        by_query = {}
        for question, answer, links in _frames_rows(path):
            hits = [(link.rsplit("/", 1)[-1], link, f"... {answer} ...") for link in links]
            topic = urllib.parse.quote_plus(question[:60])
            hits.append(
                ("Encyclopedia", f"https://www.britannica.com/search?query={topic}", answer)
            )
            by_query[question] = hits
        kwargs.setdefault("provider", "tavily")
        return cls(by_query=by_query, **kwargs)

    def _answer(self, path: str, body: JSONObject) -> JSONObject | None:
        hits = self.by_query.get(str(body.get("query", "")))
        if hits is None:
            return super()._answer(path, body)
        return FakeWebProvider._answer(dataclasses.replace(self, results=hits), path, body)


def web_research_oracle(path: Path = WEB_RESEARCH_SAMPLE) -> Policy:
    """WebResearchEnv's oracle: one ``web_search``, then the answer citing two domains."""
    answers = {question: answer for question, answer, _ in _frames_rows(path)}

    def policy(request: PolicyRequest) -> str:
        match = re.search(r"^Question: (.+)$", request.last_user_text, re.M)
        question = match.group(1).strip() if match else ""
        if question not in answers:
            return "I do not know this question."
        done = _tool_results(request)
        if not done:
            return _tool_call("web_search", {"query": question})
        by_host: dict[str, str] = {}
        for url in re.findall(r'"url":\s*"([^"]+)"', done[-1]):
            by_host.setdefault(urllib.parse.urlsplit(url).hostname or url, url)
        sources = " ".join(list(by_host.values())[:2])
        return f"The answer is {answers[question]}. Sources: {sources}"

    return policy


def scripted_judge(request: PolicyRequest) -> str:
    """WebResearchEnv's judge: 1.0 when the answer holds the reference (case and spacing aside)."""
    text = request.last_user_text
    reference = re.search(r"^Reference answer: (.*)$", text, re.M)
    answer = re.search(r"^Model answer: (.*?)\n\nScore", text, re.M | re.S)
    if reference is None or answer is None:
        return "I cannot judge this."

    def norm(value: str) -> str:
        return " ".join(value.lower().split())

    correct = norm(reference.group(1)) in norm(answer.group(1))
    reason = "matches the reference" if correct else "does not give the reference answer"
    return json.dumps({"score": 1.0 if correct else 0.0, "reason": reason})


@asynccontextmanager
async def open_web_research_world(
    path: Path = WEB_RESEARCH_SAMPLE,
) -> AsyncIterator[tuple[str, str]]:
    """Serve :class:`SampleWebProvider` (Tavily's API) and :func:`scripted_judge` on loopback.

    Yields ``(web_url, judge_url)``: set ``TAVILY_API_KEY`` (any value),
    ``TAVILY_BASE_URL=web_url`` and ``--env.judge_base_url judge_url``.

    **Cancellation**: both servers stop.
    """
    web = SampleWebProvider.for_sample(path)
    judge = ScriptedModelServer(scripted_judge, model_name="scripted-judge")
    async with open_loopback_server(web) as web_url, open_loopback_server(judge) as judge_url:
        yield web_url, judge_url + "/v1"


async def _serve_world() -> None:
    async with open_web_research_world() as (web_url, judge_url):
        print(f"export TAVILY_API_KEY=fake TAVILY_BASE_URL={web_url}", flush=True)
        print(f"--env.judge_base_url {judge_url} --env.judge_model_name scripted-judge", flush=True)
        await anyio.sleep_forever()


def main(argv: list[str] | None = None) -> int:
    """``python -m hermes_async.testing.benchmarks web-research-world``: serve until Ctrl-C."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["web-research-world"]:
        print(
            "usage: python -m hermes_async.testing.benchmarks web-research-world", file=sys.stderr
        )
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(_serve_world)
    return 0


if __name__ == "__main__":
    sys.exit(main())

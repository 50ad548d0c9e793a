"""Our streaming tool-call parsers side by side with vLLM 0.32's, fed the way its server feeds them.

For each family both projects support, one model output — a ``write_file`` call whose
``content`` argument is source code of about 1k, 10k and 100k tokens, tokenized with the
project's offline tokenizer for that family — is streamed at 1 and 8 tokens per delta through:

* **vLLM**: the ``Parser`` its OpenAI server builds (``ParserManager.get_parser(tool_parser_name=
  ..., enable_auto_tools=True)``, constructed as ``cls(tokenizer, tools)``), one
  ``parse_delta(delta_text, delta_token_ids, request, prompt_token_ids, finished=...)`` per
  delta, exactly as ``chat_completion/serving.py`` calls it. That routes a legacy ``ToolParser``
  through ``extract_tool_calls_streaming`` on the accumulated text and ids, and a parser-engine
  adapter through its streaming engine. ``request.skip_special_tokens`` is what the parser's
  ``adjust_request`` leaves it at, and the delta texts are decoded accordingly (the engine reads
  special tokens from the ids).
* **ours**: ``get_parser(name, tools=..., tokenizer=...)``, one ``feed(text, ids)`` per delta and
  ``finish()``, as the agent loop's token turn feeds it. Two modes: ``eq`` (equal event
  granularity: the deferred-scan fast path is switched off after every feed, so each delta is
  scanned and yields its argument fragment at once, as vLLM's does) and ``default`` (the
  shipped batching: argument fragments coalesce over up to 128 deltas; sealing is never
  deferred).

Decoding is done before timing on both sides (the parser's work only). Times are CPU seconds of
this process (``time.process_time``), best of several runs; a vLLM run that passes its budget
(``max(--budget, --cut-factor x ours)``, default 30 s and 110x) is cut and reported as
``> X s (cut)``: its ratio is then a lower bound, and its calls are not compared. Both sides must produce the same final calls (name + parsed arguments); a mismatch
is printed and makes the exit status 1.

Acceptance (issue 23): at 100k tokens, 1 token per delta, equal granularity, ours >= 100x
faster than vLLM's hermes parser; ratio >= 1.0 against every parser-engine family at every size.

Run (inside the CPU vLLM venv; ``make test-vllm`` builds it)::

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python bench/parsers_vs_vllm.py [--families hermes,kimi_k2]
        [--sizes 1000,10000] [--chunks 1,8] [--budget 30] [--cut-factor 110]

From the project venv it re-executes itself with ``.venv-vllm/bin/python`` next to this
checkout, or says how to build that venv and exits 0. The tokenizer directories are built
offline by the project venv (``.venv/bin/python``; cached under the tokenizer cache).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parsers import CODE_SAMPLE  # bench/parsers.py's argument text: one sample for both

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout, not a venv's copy

try:
    import vllm  # noqa: F401
except ImportError:
    _vllm_python = ROOT / ".venv-vllm" / "bin" / "python"
    if _vllm_python.exists() and os.environ.get("_HERMES_PVV_REEXEC") != "1":
        os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", _HERMES_PVV_REEXEC="1")
        os.execv(str(_vllm_python), [str(_vllm_python), __file__, *sys.argv[1:]])
    print(
        "parsers_vs_vllm: vLLM is not importable here; build its CPU venv with `make test-vllm` "
        "(or `bash scripts/vllm/setup_venv.sh`), then run `.venv-vllm/bin/python "
        "bench/parsers_vs_vllm.py` (skipped)"
    )
    sys.exit(0)

#: A vLLM run is cut once it has used this many times our equal-granularity CPU time (proves
#: a ratio above 100 without waiting minutes for a quadratic parser), or --budget if larger.
CUT_FACTOR = 110
SIZES = (1_000, 10_000, 100_000)
CHUNKS = (1, 8)
PATH_ARG = "src/handler.py"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    }
]


def _json_args(content: str) -> str:
    return json.dumps({"path": PATH_ARG, "content": content})


def _hermes(c: str) -> str:
    return f'<tool_call>\n{{"name": "write_file", "arguments": {_json_args(c)}}}\n</tool_call>'


def _qwen3_coder(c: str) -> str:
    return (
        "<tool_call>\n<function=write_file>\n<parameter=path>\n"
        f"{PATH_ARG}\n</parameter>\n<parameter=content>\n{c}\n</parameter>\n"
        "</function>\n</tool_call>"
    )


def _deepseek_v3(c: str) -> str:
    return (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>write_file\n"
        f"```json\n{_json_args(c)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )


def _deepseek_v31(c: str) -> str:
    return (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write_file<｜tool▁sep｜>"
        f"{_json_args(c)}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )


def _kimi_k2(c: str) -> str:
    return (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0"
        f"<|tool_call_argument_begin|>{_json_args(c)}<|tool_call_end|><|tool_calls_section_end|>"
    )


def _glm45(c: str) -> str:
    return (
        f"<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>{PATH_ARG}</arg_value>\n"
        f"<arg_key>content</arg_key>\n<arg_value>{c}</arg_value>\n</tool_call>"
    )


def _glm47(c: str) -> str:
    return (
        f"<tool_call>write_file<arg_key>path</arg_key><arg_value>{PATH_ARG}</arg_value>"
        f"<arg_key>content</arg_key><arg_value>{c}</arg_value></tool_call>"
    )


def _mistral(c: str) -> str:
    return f"[TOOL_CALLS]write_file[ARGS]{_json_args(c)}"


def _llama3_json(c: str) -> str:
    return f'{{"name": "write_file", "parameters": {_json_args(c)}}}'


@dataclass(frozen=True)
class Family:
    ours: str  # our registry name
    vllm: str  # vLLM's --tool-call-parser name
    tokenizer: str  # `qwen` or a key of hermes_async.inference.families.FAMILIES
    render: Callable[[str], str]


FAMILY_CASES: dict[str, Family] = {
    "hermes": Family("hermes", "hermes", "qwen", _hermes),
    "qwen3_coder": Family("qwen3_coder", "qwen3_coder", "qwen", _qwen3_coder),
    "deepseek_v3": Family("deepseek_v3", "deepseek_v3", "deepseek_v3", _deepseek_v3),
    "deepseek_v3_1": Family("deepseek_v3_1", "deepseek_v31", "deepseek_v31", _deepseek_v31),
    "kimi_k2": Family("kimi_k2", "kimi_k2", "kimi_k2", _kimi_k2),
    "glm45": Family("glm45", "glm45", "glm45", _glm45),
    "glm47": Family("glm47", "glm47", "glm45", _glm47),
    "mistral": Family("mistral", "mistral", "mistral_v11", _mistral),
    "llama3_json": Family("llama3_json", "llama3_json", "llama3", _llama3_json),
}
#: Ours has a format vLLM 0.32 has no parser for (said in the output, not measured).
NOT_COMPARED = {
    "deepseek_v4": "vLLM's deepseek_v4/v32 parsers read DSML <｜DSML｜invoke name=...> / "
    "<｜DSML｜parameter ...> XML; ours reads <｜DSML｜tool_call_begin｜>name + JSON: "
    "different wire formats, no common output",
}


def tokenizer_dirs(names: set[str]) -> dict[str, str]:
    """Build (or reuse) the offline tokenizer directories with the project venv."""
    project_python = ROOT / ".venv" / "bin" / "python"
    code = (
        "import json, sys\n"
        "from hermes_async.inference.families import family_tokenizer_dir\n"
        "from hermes_async.inference.hf import qwen_offline_hf_dir\n"
        "print(json.dumps({n: str(qwen_offline_hf_dir() if n == 'qwen' "
        "else family_tokenizer_dir(n)) for n in sys.argv[1:]}))\n"
    )
    python = str(project_python) if project_python.exists() else sys.executable
    out = subprocess.run(
        [python, "-c", code, *sorted(names)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    result: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@dataclass
class Case:
    family: str
    tokens: int
    chunk: int
    ids_chunks: list[list[int]]
    ours_text: list[str]  # specials spelled (the agent loop's decoder)
    vllm_text: list[str]  # as vLLM's detokenizer gives it under the request's settings


@dataclass
class Run:
    cpu: float  # best CPU seconds
    cut: bool
    calls: list[tuple[str, Any]] | None
    arg_events: int
    error: str | None = None


def vllm_run(parser_cls: Any, tok: Any, request: Any, case: Case, budget: float, runs: int) -> Run:
    best = float("inf")
    calls: list[tuple[str, Any]] | None = None
    events = 0
    n = len(case.ids_chunks)
    prompt = [1, 2, 3]
    for _ in range(runs):
        parser = parser_cls(tok, request.tools)
        names: dict[int, str] = {}
        args: dict[int, list[str]] = {}
        events = 0
        parse_delta = parser.parse_delta
        start = time.process_time()
        cut = False
        for k, (text, ids) in enumerate(zip(case.vllm_text, case.ids_chunks, strict=True)):
            msg = parse_delta(
                delta_text=text,
                delta_token_ids=ids,
                request=request,
                prompt_token_ids=prompt,
                finished=k == n - 1,
            )
            if msg is not None and msg.tool_calls:
                for tc in msg.tool_calls:
                    fn = tc.function
                    if fn is None:
                        continue
                    if fn.name:
                        names[tc.index] = names.get(tc.index, "") + fn.name
                    if fn.arguments:
                        args.setdefault(tc.index, []).append(fn.arguments)
                        events += 1
            if k & 63 == 63 and time.process_time() - start > budget:
                cut = True
                break
        elapsed = time.process_time() - start
        if cut:
            return Run(elapsed, True, None, events)
        best = min(best, elapsed)
        calls = []
        for index in sorted(set(names) | set(args)):
            raw = "".join(args.get(index, []))
            try:
                value: Any = json.loads(raw) if raw else {}
            except ValueError:
                value = f"<invalid JSON, {len(raw)} chars: {raw[:60]!r}...>"
            calls.append((names.get(index, ""), value))
        if best * (runs - 1) > budget:  # one more would pass the budget: keep what we have
            break
    return Run(best, False, calls, events)


def ours_run(name: str, tok: Any, case: Case, *, equal: bool, runs: int) -> Run:
    from hermes_async.parsers import ArgumentsDelta, get_parser

    best = float("inf")
    result = None
    events = 0
    for _ in range(runs):
        parser = get_parser(name, tools=TOOLS, tokenizer=tok)
        feed = parser.feed
        events = 0
        start = time.process_time()
        if equal:
            for text, ids in zip(case.ours_text, case.ids_chunks, strict=True):
                out = feed(text, ids)
                # Equal granularity: no deferred scan, so this delta's fragment comes now.
                parser._wake = None
                for ev in out:
                    if type(ev) is ArgumentsDelta:
                        events += 1
        else:
            for text, ids in zip(case.ours_text, case.ids_chunks, strict=True):
                for ev in feed(text, ids):
                    if type(ev) is ArgumentsDelta:
                        events += 1
        result = parser.finish()
        best = min(best, time.process_time() - start)
    assert result is not None
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in result.tool_calls or []]
    return Run(best, False, calls, events)


def build_cases(
    fam: Family,
    hf: Any,
    ours_tok: Any,
    skip_special: bool,
    sizes: Sequence[int],
    chunks: Sequence[int],
) -> list[Case]:
    per = len(hf.encode(CODE_SAMPLE, add_special_tokens=False))
    cases = []
    for size in sizes:
        text = fam.render(CODE_SAMPLE * max(1, size // per))
        ids = hf.encode(text, add_special_tokens=False)
        for n in chunks:
            ids_chunks = [ids[i : i + n] for i in range(0, len(ids), n)]
            decoder = ours_tok.incremental_decoder()
            ours_text = [decoder.decode(c) for c in ids_chunks]
            tail = decoder.flush()
            if tail:
                ours_text[-1] += tail
            if "".join(ours_text) != text:
                raise SystemExit(f"{fam.ours}: the decoded deltas do not spell the output")
            vllm_text = [hf.decode(c, skip_special_tokens=skip_special) for c in ids_chunks]
            cases.append(Case(fam.ours, len(ids), n, ids_chunks, ours_text, vllm_text))
    return cases


def describe(calls: list[tuple[str, Any]] | None) -> str:
    """Calls in brief: names and, per argument, its length and first characters."""
    if calls is None:
        return "no result"
    brief = []
    for name, args in calls:
        if isinstance(args, dict):
            shown = {k: f"{len(str(v))} chars {str(v)[:24]!r}" for k, v in args.items()}
        else:
            shown = {"?": str(args)[:80]}
        brief.append(f"{name}({shown})")
    return "; ".join(brief) or "no calls"


def fmt_s(run: Run) -> str:
    return f"> {run.cpu:.1f} (cut)" if run.cut else f"{run.cpu:.4f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILY_CASES))
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--chunks", default=",".join(map(str, CHUNKS)))
    ap.add_argument("--budget", type=float, default=30.0, help="CPU s per vLLM run (minimum)")
    ap.add_argument(
        "--cut-factor",
        type=float,
        default=CUT_FACTOR,
        help="cut a vLLM run past this many times ours (eq) or --budget, whichever is larger",
    )
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f]
    sizes = [int(s) for s in args.sizes.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    for f in families:
        if f not in FAMILY_CASES:
            raise SystemExit(f"unknown family {f!r}; available: {', '.join(FAMILY_CASES)}")

    import logging

    import vllm as _vllm
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.parser.engine.adapters import ParserEngineToolAdapter
    from vllm.tokenizers import get_tokenizer

    from hermes_async.inference.hf import HFTokenizer

    dirs = tokenizer_dirs({FAMILY_CASES[f].tokenizer for f in families})
    loaded: dict[str, tuple[Any, Any]] = {}
    print(
        f"vLLM {_vllm.__version__}; CPU seconds (process_time), best of runs; ratio = vLLM / ours"
    )
    for name, why in NOT_COMPARED.items():
        print(f"not compared: {name}: {why}")
    rows = []
    mismatches = []
    for fname in families:
        fam = FAMILY_CASES[fname]
        if fam.tokenizer not in loaded:
            # A tokenizer directory has no model config.json: vLLM's loader logs an error and
            # retries before it falls back to the tokenizer files alone.
            logging.disable(logging.ERROR)
            try:
                hf = get_tokenizer(dirs[fam.tokenizer], tokenizer_mode="hf")
            finally:
                logging.disable(logging.NOTSET)
            loaded[fam.tokenizer] = (hf, HFTokenizer(hf))
        hf, ours_tok = loaded[fam.tokenizer]
        try:
            parser_cls = ParserManager.get_parser(
                tool_parser_name=fam.vllm, enable_auto_tools=True, tokenizer=hf
            )
            assert parser_cls is not None
            probe = parser_cls(hf, None)
        except Exception as exc:  # report, do not fake
            print(f"{fname}: vLLM parser {fam.vllm!r} cannot be built offline: {exc!r}")
            mismatches.append(fname)
            continue
        tp = probe.tool_parser
        kind = "engine" if isinstance(tp, ParserEngineToolAdapter) else "legacy"
        request = ChatCompletionRequest(
            model="bench",
            messages=[{"role": "user", "content": "write the file"}],
            tools=TOOLS,
            tool_choice="auto",
            stream=True,
        )
        request = probe.adjust_request(request)
        skip = bool(request.skip_special_tokens)
        print(
            f"\n{fname}: ours {fam.ours!r} vs vLLM {fam.vllm!r} = {type(tp).__name__} ({kind}); "
            f"tokenizer {fam.tokenizer}; skip_special_tokens={skip}"
        )
        print(
            f"{'tokens':>7} {'chunk':>5} {'vLLM s':>14} {'ours eq s':>10} {'ratio':>8} "
            f"{'ours def s':>10} {'ratio':>8} {'arg events v/eq/def':>22} {'same calls':>10}"
        )
        for case in build_cases(fam, hf, ours_tok, skip, sizes, chunks):
            runs = 5 if case.tokens <= 20_000 else 2
            eq = ours_run(fam.ours, ours_tok, case, equal=True, runs=runs)
            default = ours_run(fam.ours, ours_tok, case, equal=False, runs=runs)
            budget = max(args.budget, args.cut_factor * eq.cpu)
            try:
                v = vllm_run(parser_cls, hf, request, case, budget, runs)
            except Exception as exc:
                v = Run(0.0, False, None, 0, error=repr(exc)[:200])
            if v.error is not None:
                same = f"vLLM raised {v.error}"
            elif v.cut:
                same = "n/a (cut)"
            else:
                same = "yes" if v.calls == eq.calls == default.calls else "NO"
            if same not in ("yes", "n/a (cut)"):
                mismatches.append(f"{fname} {case.tokens} @{case.chunk}")
                print(
                    f"  MISMATCH: vLLM {describe(v.calls)}\n            ours {describe(eq.calls)}"
                )
            r_eq = v.cpu / eq.cpu if eq.cpu else float("inf")
            r_def = v.cpu / default.cpu if default.cpu else float("inf")
            gt = ">" if v.cut else ""
            print(
                f"{case.tokens:>7} {case.chunk:>5} {fmt_s(v):>14} {eq.cpu:>10.4f} "
                f"{gt + f'{r_eq:.1f}x':>8} {default.cpu:>10.4f} {gt + f'{r_def:.1f}x':>8} "
                f"{f'{v.arg_events}/{eq.arg_events}/{default.arg_events}':>22} {same:>10}",
                flush=True,
            )
            rows.append((fname, kind, case.tokens, case.chunk, v, eq, default, same))

    print("\nacceptance (issue 23):")
    failed = bool(mismatches)
    for fname, _kind, tokens, chunk, v, eq, _default, _same in rows:
        if fname == "hermes" and tokens > 50_000 and chunk == 1:
            ok = v.cpu / eq.cpu >= 100
            print(
                f"  hermes 100k @1, equal granularity: {'>' if v.cut else ''}"
                f"{v.cpu / eq.cpu:.0f}x (>= 100x) {'ok' if ok else 'FAIL'}"
            )
    engine_rows = [r for r in rows if r[1] == "engine"]
    if engine_rows:
        worst = min(engine_rows, key=lambda r: r[4].cpu / r[5].cpu)
        ratio = worst[4].cpu / worst[5].cpu
        print(
            f"  vs the parser engine, every family and size (equal granularity): worst "
            f"{worst[0]} {worst[2]} @{worst[3]} {ratio:.2f}x (>= 1.0) "
            f"{'ok' if ratio >= 1.0 else 'FAIL'}"
        )
    if mismatches:
        print(f"  CALLS DIFFER OR vLLM FAILED: {', '.join(mismatches)}")
    print("  (streaming@1 <= 4x whole-text at 10k: see bench/parsers.py)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

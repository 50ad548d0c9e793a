"""Per-turn chat-template cost of a Phase 2 turn: full rendering vs incremental, side by side.

What one Phase 2 turn does with the template after its completion (``TokenTurns._place``):
render the conversation, decode the completion's ids, check the turn against the rendering and
cut its suffix (``place_turn``), tokenize the suffix. Measured here for the 10th and the 20th
turn of a conversation (the cost of a turn grows with the conversation when the whole of it is
rendered), with the built-in template: before (the Jinja template, the whole conversation every
turn), the built-in template in Python with full renderings, and after (Python, incremental).
Rounds alternate between the sides in one process; the ratio is before / after.

    PYTHONPATH=. .venv/bin/python bench/template_turn.py
    PYTHONPATH=. .venv/bin/python bench/template_turn.py --turns 10,20,40 --rounds 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from hermes_async.agent._segments import place_turn
from hermes_async.inference._chat_template import default_chat_template
from hermes_async.inference.families import load_family_tokenizer
from hermes_async.inference.rendering import ChatRenderer
from hermes_async.inference.tokenizer import QwenTokenizer, Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import builtin_registry

SYSTEM = "You are a careful software engineer working in a Linux sandbox."


def tool_schemas() -> list[JSONObject]:
    return list(builtin_registry().definitions(["terminal", "file"]).schemas)


def completion_text(turn: int) -> str:
    call = {"name": "terminal", "arguments": {"command": f"ls -la /work/step{turn}"}}
    return f"Step {turn}: list the files.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def turn_messages(turn: int) -> list[JSONObject]:
    call = {"name": "terminal", "arguments": {"command": f"ls -la /work/step{turn}"}}
    output = json.dumps({"output": "total 8\n-rw-r--r-- 1 root root 12 notes.txt\n" * 4})
    return [
        {
            "role": "assistant",
            "content": f"Step {turn}: list the files.",
            "tool_calls": [
                {
                    "id": f"call_{turn}",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": json.dumps(call["arguments"])},
                    "raw": json.dumps(call),
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"call_{turn}", "content": output},
    ]


def run_conversation(
    tokenizer: Tokenizer, tools: list[JSONObject], turns: int, *, incremental: bool
) -> list[float]:
    """One conversation of ``turns`` tool turns; the seconds of each turn's template work."""
    renderer = ChatRenderer(tokenizer, tools, incremental=incremental)
    messages: list[JSONObject] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "List the files of every step directory."},
    ]
    prompt = renderer.render(messages, add_generation_prompt=True)
    end = tokenizer.decode([tokenizer.eos_token_id])
    costs: list[float] = []
    for turn in range(1, turns + 1):
        ids = [*tokenizer.encode(completion_text(turn)), tokenizer.eos_token_id]
        messages.extend(turn_messages(turn))
        start = time.perf_counter()
        full = renderer.render(messages, add_generation_prompt=True)
        placement = place_turn(
            turn=turn,
            prompt=prompt,
            full=full,
            completion=tokenizer.decode(ids),
            stop_texts=[end],
            ended_on_stop=True,
            final=False,
            before=lambda: "",
        )
        tokenizer.encode(placement.suffix)
        costs.append(time.perf_counter() - start)
        assert not placement.checks, placement.checks
        prompt = full
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", default="10,20")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--family",
        default=None,
        help="a ChatML + hermes family (hermes, qwen3): before = transformers renders the "
        "whole conversation every turn, after = incremental",
    )
    args = parser.parse_args()
    marks = [int(t) for t in args.turns.split(",")]
    setups: dict[str, tuple[Tokenizer, bool]]
    if args.family is None:
        fast = QwenTokenizer()
        # The same template text under another source: rendered by Jinja, no window rule -- the
        # previous behaviour exactly (a trailing comment renders nothing).
        jinja = QwenTokenizer(chat_template=default_chat_template() + "{#- baseline -#}")
        label = "built-in ChatML + hermes template"
        setups = {
            "before: Jinja, full": (jinja, False),
            "Python, full": (fast, False),
            "after: Python, incremental": (fast, True),
        }
    else:
        family = load_family_tokenizer(args.family)
        # The previous behaviour: transformers renders the whole conversation every turn (the
        # same template under another source: neither our environment nor a window rule).
        before = load_family_tokenizer(args.family)
        source = family.chat_template_source
        assert source is not None
        before.hf_tokenizer.chat_template = source + "{#- baseline -#}"
        label = f"family {args.family!r}"
        setups = {
            "before: transformers, full": (before, False),
            "after: incremental": (family, True),
        }
    sides = list(setups)
    tools = tool_schemas()
    longest = max(marks)
    samples: dict[str, list[list[float]]] = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side, (tokenizer, incremental) in setups.items():
            samples[side].append(
                run_conversation(tokenizer, tools, longest, incremental=incremental)
            )
    print(
        f"{label}, {len(tools)} tool schemas, one call and one result "
        f"per turn; median of {args.rounds} alternating rounds per side (ms per turn)"
    )
    print(f"| turn | {' | '.join(sides)} | before / after |")
    print(f"|-----:|{'|'.join('-' * (len(side) + 1) + ':' for side in sides)}|------:|")
    for mark in marks:
        cells = [statistics.median(run[mark - 1] for run in samples[side]) * 1e3 for side in sides]
        shown = " | ".join(
            f"{cell:{len(side)}.3f}" for cell, side in zip(cells, sides, strict=True)
        )
        print(f"| {mark:4d} | {shown} | {cells[0] / cells[-1]:5.1f}x |")
    totals = [statistics.median(sum(run) for run in samples[side]) * 1e3 for side in sides]
    print(
        f"whole {longest}-turn conversation: "
        + ", ".join(f"{side} {total:.1f} ms" for side, total in zip(sides, totals, strict=True))
        + f" ({totals[0] / totals[-1]:.1f}x)"
    )


if __name__ == "__main__":
    main()

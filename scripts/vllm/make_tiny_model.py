"""Build a tiny random LlamaForCausalLM that uses the offline Qwen tokenizer (run in .venv-vllm).

vLLM needs a model directory; the hub is unreachable here, so the weights are random. Shape
(hidden 64, 2 layers, 2 heads, 1 KV head): head_dim 32, because vLLM's CPU attention backend
rejects head_dim 16 and kills the engine on the first request. vocab_size == len(tokenizer), so
every id the model samples decodes. eos = <|im_end|> (151645) so vLLM stops at the end of a turn.

Usage: python make_tiny_model.py --tokenizer DIR --out DIR [--seed N]
The tokenizer files are copied byte for byte (they come from
hermes_async.inference.hf.qwen_offline_hf_dir) and checked to load with this venv's transformers.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

CHECK_TEXT = "<|im_start|>user\nhi<|im_end|>"
CHECK_IDS = [151644, 872, 198, 6023, 151645]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    stamp = args.out / "hermes_async_model.json"
    source_stamp = (args.tokenizer / "hermes_async_tokenizer.json").read_text()
    if stamp.is_file() and json.loads(stamp.read_text()).get("tokenizer") == source_stamp:
        print(f"tiny model up to date: {args.out}")
        return

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(args.tokenizer, tmp)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp))
    ids = tokenizer.encode(CHECK_TEXT, add_special_tokens=False)
    if ids != CHECK_IDS:
        raise SystemExit(f"tokenizer check failed in this venv: {ids} != {CHECK_IDS}")

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(tmp))
    (tmp / "hermes_async_model.json").write_text(json.dumps({"tokenizer": source_stamp}))
    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)
    print(f"tiny model written: {args.out} (vocab {len(tokenizer)})")


if __name__ == "__main__":
    main()

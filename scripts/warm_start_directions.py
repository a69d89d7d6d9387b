"""Which direction a warm-started captioner states, per held-out window: the measurement behind
docs/main-job.md's "Freezing the bottom blocks, and reversed windows".

A warm start that says one direction word of (nearly) every held-out window gives RL nothing to sharpen:
RL moves that word for all windows at once (and, seeds 2 and 3 of 2026-12-05 showed, can also collapse a
warm start that tracked the direction). This script runs the package's own warm start (``train.warm_start.warm_start``) exactly as
``captionrl train lineup`` does for the config and overrides given (the same training windows, targets and
settings), then captions the config's held-out windows greedily within the RL budget and counts, per
window label (``domains.describe.overall_direction``), the direction word the caption states ("rises",
"falls", "flat"/"steady", or none). It writes ``OUT/ws_result.json`` (counts, the share right, the warm
start's seconds) and ``OUT/ws_captions.jsonl`` (every caption with its window's label).

    .venv/bin/python scripts/warm_start_directions.py OUT seed=0 train.threads=1 warm_start.freeze_layers=20

One warm start of the CPU config: ~12 min with 20 blocks frozen, ~21 min with none (two runs side by side on
2 cores of an AMD EPYC, one thread each).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

CONFIG = "configs/lineup-cpu.yaml"
WORD = {"rises": "up", "falls": "down", "flat": "flat"}


def direction_said(caption: str) -> str:
    """The first direction family the caption names: rises, falls, flat (or steady), else none."""
    low = caption.lower()
    return ("rises" if "rise" in low else "falls" if "fall" in low else
            "flat" if ("flat" in low or "steady" in low) else "none")


def main(argv: list[str]) -> int:
    if not argv or "=" in argv[0]:
        print(__doc__)
        return 2
    out, overrides = Path(argv[0]), argv[1:]
    import torch

    from captionrl.config import load_config
    from captionrl.domains.describe import overall_direction
    from captionrl.domains.lineup_data import build_lineup_data
    from captionrl.train.common import apply_threads, load_policy
    from captionrl.train.lineup_config import LineupConfig
    from captionrl.train.warm_start import printed_values, warm_start

    cfg = load_config(LineupConfig, CONFIG, overrides)
    apply_threads(cfg.train.threads)
    data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
    model, tokenizer, _ = load_policy(cfg.policy)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    summary = warm_start(cfg, data.rows["train"], model, tokenizer, out)
    seconds = time.time() - start
    model.eval()
    said: Counter[str] = Counter()
    pairs: Counter[str] = Counter()
    right = 0
    with open(out / "ws_captions.jsonl", "w") as f:
        for row in data.rows["test"]:
            ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)
            with torch.no_grad():
                tokens = model.generate(**ids, max_new_tokens=cfg.train.max_completion_length, do_sample=False)
            caption = tokenizer.decode(tokens[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
            word, label = direction_said(caption), overall_direction(printed_values(row))
            said[word] += 1
            pairs[f"{label}->{word}"] += 1
            right += int(WORD.get(word) == label)
            f.write(json.dumps({"id": row["item_id"], "label": label, "caption": caption}) + "\n")
    n = len(data.rows["test"])
    result = {"said": dict(said), "label_to_said": dict(sorted(pairs.items())), "direction_right_share": right / n,
              "windows": n, "warm_seconds": seconds, "summary": summary, "overrides": overrides}
    (out / "ws_result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

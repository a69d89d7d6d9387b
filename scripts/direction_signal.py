"""How much the captioner knows about a window's overall direction before any training, and how fast it can
be taught it: the measurement behind docs/main-job.md's "Why the direction is not learned".

The main job pays a right overall direction (issue 32), yet over 5 seeds per verifier dtype the trained
captioner's direction skill stayed at 0: it says a direction no more often where it is right than a fixed
guess would. RL can only sharpen what the policy already does a little; this script asks whether there is
anything to sharpen. For each held-out window it puts the captioner's prompt (the config's instruction and
printed numbers) before an answer that begins with ``--cue`` ("Overall, the series") and reads the log
probabilities of the next word: " rises", " falls", " stays". It reports

- ``auc``: the chance that a rising window gets a larger log p(" rises") - log p(" falls") than a falling
  one (0.5: the numbers do not move the word; 1.0: a perfect ranking). Windows are labelled by the shape
  claims' own rule (``domains.describe.overall_direction``); flat windows sit out of the AUC;
- ``accuracy``: how often the likeliest of the three words is the window's direction, beside ``majority``,
  the accuracy of always naming the commonest direction;
- ``--view``: the prompt also shows the window as a line of bar characters (a chart in text) or as values
  rescaled to 0-100, to see whether another view of the same window moves the word more;
- then, with ``--sft_epochs N``, the same after each epoch of supervised fine-tuning of a fresh copy on the
  config's training windows, the loss on that one word only: how many labelled examples the ranking needs.

    .venv/bin/python scripts/direction_signal.py --sft_epochs 1 --out direction-signal.json

Numbers for the record (2026-12-03, Intel Xeon with AMX, float32, one thread, ~9 min): docs/main-job.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

WORDS = {"up": " rises", "down": " falls", "flat": " stays"}
"""The next word the cue is read for, per direction of the shape claims' rule."""

BARS = "▁▂▃▄▅▆▇█"
VIEWS = ("numbers", "sparkline", "scaled")
"""What the prompt shows: the main job's printed numbers; the numbers and a line of bar characters, one a value
(a chart in text, the nearest a language-only captioner gets to the paper's chart image); the numbers and the
values rescaled to whole numbers from 0 to 100 (the window's own minimum and maximum)."""


def with_view(row: dict[str, Any], view: str) -> dict[str, Any]:
    """``row`` whose prompt also shows the series as ``view`` says (``numbers``: unchanged)."""
    if view == "numbers":
        return row
    v = np.asarray(row["series"], dtype=float)
    lo, span = float(v.min()), float(np.ptp(v)) or 1.0
    if view == "sparkline":
        extra = "Chart: " + "".join(BARS[min(len(BARS) - 1, int((x - lo) / span * len(BARS)))] for x in v)
    elif view == "scaled":
        extra = "Scaled 0-100: " + ", ".join(str(round(100 * (x - lo) / span)) for x in v)
    else:
        raise SystemExit(f"--view {view!r}: use one of {', '.join(VIEWS)}")
    text = row["prompt"][0]["content"].replace(row["series_text"], f"{row['series_text']}\n{extra}", 1)
    return {**row, "prompt": [{**row["prompt"][0], "content": text}]}


def auc(positive: list[float], negative: list[float]) -> float | None:
    """P(a positive scores above a negative), ties counting half; None without both kinds."""
    if not positive or not negative:
        return None
    p, n = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float((p > n).mean() + 0.5 * (p == n).mean())


def load_rows(config: Path, seed: int) -> dict[str, list[dict[str, Any]]]:
    """The config's training rows and every held-out test window, as the main job builds them."""
    from captionrl.config import from_dict
    from captionrl.domains.datasets import split_windows
    from captionrl.domains.lineup_data import LineupDataConfig, build_lineup_data

    data = dict(yaml.safe_load(config.read_text())["data"])
    cfg = from_dict(LineupDataConfig, data, prefix="data.")
    # every test window; the training sample does not depend on n_test (each split draws from its own seed)
    n_test = len(split_windows(cfg.corpus, cfg.window, stride=cfg.stride, fractions=cfg.splits)["test"])
    rows = build_lineup_data(from_dict(LineupDataConfig, {**data, "n_test": n_test}, prefix="data."), 4, seed).rows
    return {"train": rows["train"], "test": rows["test"]}


class Reader:
    """The captioner's next-word log probabilities after ``prompt + cue``."""

    def __init__(self, cue: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from captionrl.embedded import embedded_model_dir

        path = embedded_model_dir("float32")
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.cue = cue
        self.optimiser: Any = None  # made by the first ``teach``, kept across epochs (AdamW's moments)
        self.word_ids = {}
        for direction, word in WORDS.items():
            ids = self.tok(word, add_special_tokens=False).input_ids
            self.word_ids[direction] = ids[0]  # the first token decides the word (" rises" is one token here)

    def batch(self, rows: list[dict[str, Any]]) -> tuple[Any, Any]:
        """Left-padded ids and mask of the prompts with the cue."""
        texts = [self.tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) + self.cue
                 for r in rows]
        seqs = [self.tok(t, add_special_tokens=False).input_ids for t in texts]
        width = max(map(len, seqs))
        ids = self.torch.full((len(seqs), width), self.tok.pad_token_id or 0)
        mask = self.torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = self.torch.tensor(s)
            mask[i, width - len(s):] = 1
        return ids, mask

    def next_word_logits(self, rows: list[dict[str, Any]]) -> Any:
        ids, mask = self.batch(rows)
        return self.model(input_ids=ids, attention_mask=mask).logits[:, -1].log_softmax(-1)

    def measure(self, rows: list[dict[str, Any]], batch_size: int = 8) -> dict[str, Any]:
        from captionrl.domains.describe import overall_direction

        self.model.eval()
        scores: dict[str, list[float]] = {d: [] for d in WORDS}
        right = []
        with self.torch.no_grad():
            for i in range(0, len(rows), batch_size):
                chunk = rows[i:i + batch_size]
                for row, lp in zip(chunk, self.next_word_logits(chunk), strict=True):
                    truth = overall_direction(np.asarray(row["series"], dtype=float))
                    word = {d: float(lp[t]) for d, t in self.word_ids.items()}
                    scores[truth].append(word["up"] - word["down"])
                    right.append(max(word, key=word.__getitem__) == truth)
        counts = {d: len(v) for d, v in scores.items()}
        return {"auc": auc(scores["up"], scores["down"]), "accuracy": float(np.mean(right)),
                "majority": max(counts.values()) / max(1, sum(counts.values())), "windows": counts}

    def teach(self, rows: list[dict[str, Any]], lr: float, seed: int, batch_size: int = 8) -> float:
        """One epoch of supervised fine-tuning on the direction word; the last batch's loss."""
        from captionrl.domains.describe import overall_direction

        torch = self.torch
        self.model.train()
        if self.optimiser is None:
            self.optimiser = torch.optim.AdamW(self.model.parameters(), lr=lr)
        order = np.random.default_rng(seed).permutation(len(rows))
        loss = torch.tensor(0.0)
        for i in range(0, len(rows), batch_size):
            chunk = [rows[j] for j in order[i:i + batch_size]]
            target = torch.tensor([self.word_ids[overall_direction(np.asarray(r["series"], dtype=float))] for r in chunk])
            ids, mask = self.batch(chunk)
            loss = torch.nn.functional.cross_entropy(self.model(input_ids=ids, attention_mask=mask).logits[:, -1], target)
            loss.backward()
            self.optimiser.step()
            self.optimiser.zero_grad()
        return float(loss.detach())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=Path("configs/lineup-cpu.yaml"))
    ap.add_argument("--cue", default="Overall, the series", help="the answer's opening words before the direction word")
    ap.add_argument("--view", default="numbers", choices=VIEWS, help="what the prompt shows of each window")
    ap.add_argument("--n_test", type=int, default=None, help="held-out windows to read (default: all)")
    ap.add_argument("--sft_epochs", type=int, default=0)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rows = {split: [with_view(r, args.view) for r in part] for split, part in load_rows(args.config, args.seed).items()}
    test = rows["test"][: args.n_test]
    reader = Reader(args.cue)
    report: dict[str, Any] = {"config": str(args.config), "view": args.view, "cue": args.cue, "lr": args.lr, "epochs": []}
    start = time.time()
    for epoch in range(args.sft_epochs + 1):
        loss = reader.teach(rows["train"], args.lr, args.seed + epoch) if epoch else None
        row = {"epoch": epoch, "train_loss": loss, **reader.measure(test), "seconds": round(time.time() - start, 1)}
        report["epochs"].append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The reference models' held-out captions are kept by what made them (weights, prompt, budget) and read back
only when all of it is the same: real embedded captioner, real greedy generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.domains.lineup_data import build_lineup_data
from captionrl.train import lineup_eval
from captionrl.train.lineup_config import LineupConfig

CPU = Path(__file__).resolve().parents[1] / "configs" / "lineup-cpu.yaml"


@pytest.fixture(scope="module")
def captioner():
    from captionrl.train.run.loading import load_policy

    cfg = load_config(LineupConfig, CPU, ["data.n_train=4", "data.n_test=3", "train.threads=2"])
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["test"]
    model, processing, _ = load_policy(cfg.policy)
    model.eval()
    return model, processing, rows


def test_weights_digest_follows_every_weight(captioner):
    import torch

    model = captioner[0]
    before = lineup_eval.weights_digest(model)
    assert before == lineup_eval.weights_digest(model) and len(before) == 64
    weight = model.model.norm.weight
    with torch.no_grad():
        weight[0] += 1e-3
    try:
        assert lineup_eval.weights_digest(model) != before
    finally:
        with torch.no_grad():
            weight[0] -= 1e-3
    assert lineup_eval.weights_digest(model) == before


def test_stored_captions_are_the_greedy_captions_and_are_not_made_twice(captioner, tmp_path, monkeypatch):
    import torch

    model, processing, rows = captioner
    asked: list[int] = []
    generate = lineup_eval.generate_captions

    def counted(model, processing, rows, *args, **kwargs):
        asked.append(len(rows))
        return generate(model, processing, rows, *args, **kwargs)

    monkeypatch.setattr(lineup_eval, "generate_captions", counted)
    store = tmp_path / "eval" / "reference_captions.jsonl"
    cut: dict[str, bool] = {}
    made: list[bool] = []  # what the progress line is told: captioned now, or read back (skipped, untimed)
    first = lineup_eval.stored_captions(store, model, processing, rows, 12, False, "initial", cut, on_done=made.append)
    assert asked == [3] and made == [True]
    assert first == generate(model, processing, rows, 12, False, "direct")  # what is kept is what generation says
    assert set(cut) == set(first) and all(isinstance(v, bool) for v in cut.values())

    cut_again: dict[str, bool] = {}
    assert lineup_eval.stored_captions(store, model, processing, rows, 12, False, "initial", cut_again,
                                       on_done=made.append) == first
    assert asked == [3] and cut_again == cut and made == [True, False]  # read back, clipping included

    lineup_eval.stored_captions(store, model, processing, rows, 16, False, "initial")
    assert asked == [3, 3]  # another token budget: captioned again
    changed = [{**rows[0], "prompt": [{"role": "user", "content": "Describe: 1, 2, 3"}]}, *rows[1:]]
    lineup_eval.stored_captions(store, model, processing, changed, 12, False, "initial")
    assert asked == [3, 3, 1]  # only the window whose prompt changed

    weight = model.model.norm.weight
    with torch.no_grad():
        weight.mul_(1.5)
    try:
        lineup_eval.stored_captions(store, model, processing, rows[:2], 12, False, "initial")
    finally:
        with torch.no_grad():
            weight.div_(1.5)
    assert asked == [3, 3, 1, 2]  # other weights: captioned again

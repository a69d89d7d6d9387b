"""The warm start before LineupRL (``train.warm_start``): its targets are right about every window they
are written for and are not one template; its config refuses what it cannot do; inside a run it trains
before RL and a rerun does not train it twice; and it teaches the embedded captioner to write them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from captionrl.config import load_config
from captionrl.domains.describe import short_description
from captionrl.domains.lineup_data import build_lineup_data
from captionrl.errors import ConfigError
from captionrl.eval.description import description_checks
from captionrl.train.lineup import LineupConfig
from captionrl.train.warm_start import WarmStartConfig, names_extremum, printed_values, warm_start_records

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "configs" / "lineup-cpu.yaml"


def _rows(n_train: int = 48) -> list[dict]:
    cfg = load_config(LineupConfig, CPU, [f"data.n_train={n_train}", "data.n_test=4"])
    return build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from captionrl.embedded import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir("float32"))


def test_the_targets_state_the_right_direction_of_every_window_and_are_no_template(tokenizer):
    rows = _rows()
    cfg = load_config(LineupConfig, CPU, [])
    records = warm_start_records(rows, 2)
    captions = {r["id"]: r["caption"] for r in records}
    series = {str(r["item_id"]): r["series"] for r in rows}
    checks = description_checks(captions, series, instruction=cfg.instruction())
    assert np.mean(list(checks["direction_right"].values())) == 1.0
    assert np.mean(list(checks["key_facts"].values())) >= 2.9  # direction, start, end
    assert sum(checks["wrong_facts"].values()) <= 1  # a value rounded at the printed precision, at most
    assert not any(checks["degenerate"].values()) and not any(checks["same_sentence"].values())
    # the direction word changes with the window: the sentence is not said whatever the window
    assert {c.split(". ")[0].removeprefix("Overall, the series ") for c in captions.values()} == {
        "rises", "falls", "stays roughly flat"}
    longest = max(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in captions.values())
    assert longest <= 37  # fits the CPU job's 40-token budget, end of turn included
    assert all(r["prompt"] == row["prompt"] for r, row in zip(records, rows, strict=True))  # the RL prompts


def test_the_values_first_targets_are_read_as_the_same_facts(tokenizer):
    """``warm_start.order: values_first``: the direction after the two values; the checks read the same
    direction and key facts from it, and it still fits the token budget."""
    rows = _rows()
    cfg = load_config(LineupConfig, CPU, ["warm_start.order=values_first"])
    records = warm_start_records(rows, 2, order=cfg.warm_start.order)
    captions = {r["id"]: r["caption"] for r in records}
    assert all(c.startswith("It starts at ") and ", so overall the series " in c for c in captions.values())
    series = {str(r["item_id"]): r["series"] for r in rows}
    checks = description_checks(captions, series, instruction=cfg.instruction())
    assert np.mean(list(checks["direction_right"].values())) == 1.0
    assert np.mean(list(checks["key_facts"].values())) >= 2.9
    assert not any(checks["degenerate"].values()) and not any(checks["same_sentence"].values())
    longest = max(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in captions.values())
    assert longest <= 37
    with pytest.raises(ConfigError) as err:
        load_config(LineupConfig, CPU, ["warm_start.order=last"])
    assert err.value.field == "warm_start.order"


def test_the_target_is_written_from_the_printed_values():
    assert short_description(np.array([1.0, 3.0, 2.0, 2.5])) == "Overall, the series rises. It starts at 1 and ends at 2.5."
    assert short_description(np.array([3.0, 1.0, 2.0, 2.5, 0.5])) == "Overall, the series falls. It starts at 3 and ends at 0.5."
    assert (short_description(np.array([3.0, 1.0, 2.0, 2.5, 0.5]), order="values_first")
            == "It starts at 3 and ends at 0.5, so overall the series falls.")
    assert short_description(np.array([2.0, 2.1, 1.9, 2.0])).startswith("Overall, the series stays roughly flat.")
    row = {"series_text": "1.00, 2.50, -0.30"}
    assert printed_values(row) == [1.0, 2.5, -0.3]


def test_the_extremum_sentence_names_the_interior_extreme_beyond_the_endpoints():
    """The third sentence names the extreme that lies farthest outside the start-end range, with its value
    as printed, and the claim checker reads it as that statistic; a monotone window has none."""
    from captionrl.domains.describe import interior_extremum
    from captionrl.judges.claims import extract_rules

    hump = np.array([3.0, 4.0, 6.0, 5.0, 2.5, 3.5])  # max 6 is 2.5 above the endpoints, min 2.5 only 0.5 below
    caption = short_description(hump, extremum=True)
    assert caption == "Overall, the series stays roughly flat. It starts at 3 and ends at 3.5. Its highest value is 6."
    dip = np.array([3.0, 1.0, 2.0, 2.5, 3.5])
    assert interior_extremum(dip) == "Its lowest value is 1."
    assert interior_extremum(np.arange(5.0)) is None
    assert short_description(np.arange(5.0), extremum=True) == short_description(np.arange(5.0))
    stats = [(c.stat, c.value) for c in extract_rules(caption) if c.kind == "stat"]
    assert stats == [("max", 6.0)]


def test_a_share_of_the_targets_names_the_extreme_the_same_way_every_time():
    """``extremum_share``: about that share of the records (those with an interior extreme) carry the third
    sentence; the draw depends on the seed and the window's id only, so shuffled rows get the same targets."""
    rows = _rows(24)
    plain = warm_start_records(rows, 2)
    half = warm_start_records(rows, 2, extremum_share=0.5, seed=3)
    named = [h["caption"] != p["caption"] for h, p in zip(half, plain, strict=True)]
    assert 0 < sum(named) < len(rows)
    assert all(h["caption"].startswith(p["caption"]) for h, p in zip(half, plain, strict=True))
    again = warm_start_records(rows[::-1], 2, extremum_share=0.5, seed=3)[::-1]
    assert again == half
    other_seed = warm_start_records(rows, 2, extremum_share=0.5, seed=4)
    assert [o["caption"] for o in other_seed] != [h["caption"] for h in half]
    from captionrl.domains.describe import interior_extremum

    every = warm_start_records(rows, 2, extremum_share=1.0)
    for e, p, row in zip(every, plain, rows, strict=True):
        extra = interior_extremum(np.array(printed_values(row)), 2)
        assert e["caption"] == (f"{p['caption']} {extra}" if extra else p["caption"])
    assert warm_start_records(rows, 2, extremum_share=0.0) == plain


def test_drawn_per_pass_each_window_is_taught_the_extremum_sentence_in_some_passes_not_all():
    """``extremum_draw="pass"``: one copy of the records per pass, the same prompts in each, the extremum
    sentence drawn afresh per (window, pass), so about ``extremum_share`` of a window's passes name it and the
    warm start cannot learn which windows get one; the draws do not depend on the rows' order."""
    from captionrl.train.warm_start import passes_drawn

    assert passes_drawn(16, "pass", 0.5) == 16 and passes_drawn(2.5, "pass", 0.5) == 3
    assert passes_drawn(16, "window", 0.5) == passes_drawn(16, "pass", 0.0) == passes_drawn(16, "pass", 1.0) == 1
    rows = _rows(24)
    plain = warm_start_records(rows, 2, seed=3, rescale_share=0.5)  # no extremum sentence
    per_pass = warm_start_records(rows, 2, extremum_share=0.5, seed=3, rescale_share=0.5, passes=8,
                                  extremum_draw="pass")
    assert len(per_pass) == 8 * len(rows) and len({r["id"] for r in per_pass}) == len(per_pass)
    by_window: dict[str, list[bool]] = {}
    for i, r in enumerate(per_pass):
        base = plain[i % len(rows)]
        assert r["prompt"] == base["prompt"] and r["id"] == f"{base['id']}#{i // len(rows)}"
        assert r["caption"].startswith(base["caption"])
        by_window.setdefault(base["id"], []).append(r["caption"] != base["caption"])
    with_extreme = [named for named in by_window.values() if any(named)]  # windows that have an interior extreme
    assert with_extreme and all(not all(named) for named in with_extreme)
    assert 0.3 < np.mean([n for named in with_extreme for n in named]) < 0.7
    assert warm_start_records(rows[::-1], 2, extremum_share=0.5, seed=3, rescale_share=0.5, passes=8,
                              extremum_draw="pass") == [
        r for p in range(8) for r in per_pass[p * len(rows):(p + 1) * len(rows)][::-1]]


def test_drawn_per_pass_each_window_is_shown_under_a_new_map_every_pass_and_never_under_rls():
    """``rescale_draw="pass"``: one copy of the records per pass, each window rescaled afresh in each (so the
    warm start cannot learn a window's caption from its numbers by heart), none under the map RL's rescaled
    lineups show it under, each target written from the values its own prompt shows; the extremum sentence
    stays drawn per window (``extremum_draw="window"``), and nothing depends on the rows' order."""
    from captionrl.domains.rescale import rescaled_lineup_rows
    from captionrl.domains.timeseries import render_numbers
    from captionrl.train.warm_start import names_extremum, passes_drawn

    assert passes_drawn(16, "window", 0.0, "pass", 1.0) == 16 and passes_drawn(2.5, "window", 0.0, "pass", 0.5) == 3
    assert passes_drawn(16, "window", 0.5, "pass", 0.0) == passes_drawn(16, "window", 0.5, "window", 1.0) == 1
    rows = _rows(24)
    once = warm_start_records(rows, 2, extremum_share=0.5, seed=3, rescale_share=1.0, extremum_draw="window")
    per_pass = warm_start_records(rows, 2, extremum_share=0.5, seed=3, rescale_share=1.0, passes=4,
                                  extremum_draw="window", rescale_draw="pass")
    assert len(per_pass) == 4 * len(rows) and len({r["id"] for r in per_pass}) == len(per_pass)
    rl_prompts = [r["prompt"] for r in rescaled_lineup_rows(rows, 1.0, seed=3, precision=2)]
    for i, rec in enumerate(per_pass):
        row, pass_index = rows[i % len(rows)], i // len(rows)
        assert rec["id"] == f"{row['item_id']}#{pass_index}"
        text = rec["prompt"][-1]["content"].split("\n")[1]
        shown = [float(x) for x in text.split(", ")]
        assert text == render_numbers(np.array(shown), precision=2)[0]
        extremum = names_extremum(str(row["item_id"]), 0.5, 3)  # drawn once per window, as without passes
        assert rec["caption"] == short_description(shown, 2, extremum=extremum)
        assert rec["prompt"] != rl_prompts[i % len(rows)] and rec["prompt"] != once[i % len(rows)]["prompt"]
    for w in range(len(rows)):
        assert len({per_pass[p * len(rows) + w]["prompt"][-1]["content"] for p in range(4)}) == 4
    assert warm_start_records(rows[::-1], 2, extremum_share=0.5, seed=3, rescale_share=1.0, passes=4,
                              extremum_draw="window", rescale_draw="pass") == [
        r for p in range(4) for r in per_pass[p * len(rows):(p + 1) * len(rows)][::-1]]


@pytest.mark.parametrize(("override", "field"), [
    ("warm_start.rescale_draw=epoch", "warm_start.rescale_draw"),
    ("warm_start.epochs=-1", "warm_start.epochs"),
    ("warm_start.learning_rate=0", "warm_start.learning_rate"),
    ("warm_start.batch_size=0", "warm_start.batch_size"),
    ("warm_start.freeze_layers=-1", "warm_start.freeze_layers"),
    ("warm_start.freeze_layers=2.5", "warm_start.freeze_layers"),
    ("warm_start.extremum_share=1.5", "warm_start.extremum_share"),
    ("warm_start.extremum_share=-0.1", "warm_start.extremum_share"),
    ("warm_start.rescale_share=2", "warm_start.rescale_share"),
    ("warm_start.extremum_draw=epoch", "warm_start.extremum_draw"),
])
def test_bad_warm_start_settings_name_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config(LineupConfig, CPU, [override])
    assert err.value.field == field


def test_a_warm_start_of_adapters_or_of_a_chart_reader_is_refused():
    with pytest.raises(ConfigError, match=r"policy\.lora"):
        load_config(LineupConfig, CPU, ["warm_start.epochs=1", "policy.lora=true"])
    with pytest.raises(ConfigError, match="chart"):
        load_config(LineupConfig, CPU, ["warm_start.epochs=1", "policy.input=chart"])
    assert not WarmStartConfig().enabled  # the paper's recipe: RL from the initial model


def test_reversed_windows_teach_the_opposite_direction_from_the_same_values():
    """``reverse``: each window also appears reversed, its target the describer's caption of the reversed
    values; a rising window's reverse falls, so one direction word cannot fit both records."""
    rows = _rows(24)
    plain = warm_start_records(rows, 2)
    both = warm_start_records(rows, 2, reverse=True)
    assert both[0::2] == plain and len(both) == 2 * len(rows)
    for row, rec in zip(rows, both[1::2], strict=True):
        assert rec["id"] == f"{row['item_id']}~reversed"
        text = rec["prompt"][-1]["content"]
        flipped = ", ".join(reversed(row["series_text"].split(", ")))
        assert flipped in text and text.replace(flipped, row["series_text"]) == row["prompt"][-1]["content"]
        assert rec["caption"] == short_description(printed_values(row)[::-1], 2)
    words = {(a["caption"].split(". ")[0], b["caption"].split(". ")[0]) for a, b in zip(both[0::2], both[1::2], strict=True)}
    assert ("Overall, the series rises", "Overall, the series falls") in words
    assert ("Overall, the series falls", "Overall, the series rises") in words
    assert all(a != "Overall, the series rises" or b == "Overall, the series falls" for a, b in words)


def test_rescaled_windows_keep_their_shape_and_their_target_follows_the_printed_values():
    """``rescale_share``: that share of the windows is shown at another level and spread, half of them upside
    down; each prompt shows exactly the values its target describes, the direction is kept (or, mirrored,
    reversed), levels spread over orders of magnitude, and the draw depends on the seed and id only."""
    from captionrl.domains.describe import overall_direction
    from captionrl.domains.timeseries import render_numbers

    rows = _rows(48)
    plain = warm_start_records(rows, 2)
    assert warm_start_records(rows, 2, rescale_share=0.0) == plain
    every = warm_start_records(rows, 2, rescale_share=1.0, seed=1)
    assert [e["id"] for e in every] == [p["id"] for p in plain]
    kept = mirrored = 0
    levels = []
    flip = {"up": "down", "down": "up", "flat": "flat"}
    for row, rec in zip(rows, every, strict=True):
        text = rec["prompt"][-1]["content"].split("\n")[1]
        shown = [float(x) for x in text.split(", ")]
        assert text == render_numbers(np.array(shown), precision=2)[0] != row["series_text"]
        assert rec["prompt"][-1]["content"].replace(text, row["series_text"]) == row["prompt"][-1]["content"]
        assert rec["caption"] == short_description(shown, 2)  # written from what the captioner is shown
        before, after = np.array(printed_values(row)), np.array(shown)
        if np.ptp(before) == 0 or np.ptp(after) == 0:
            continue
        corr = np.corrcoef(before, after)[0, 1]
        assert abs(corr) > 0.98  # the same shape, upright or upside down (up to the printed rounding)
        upright = corr > 0
        assert overall_direction(after) == (overall_direction(before) if upright else flip[overall_direction(before)])
        kept, mirrored = kept + upright, mirrored + (not upright)
        levels.append(np.log10(abs(after).mean() + 1e-9))
    assert kept > 10 and mirrored > 10
    assert max(levels) - min(levels) > 3  # levels over at least three orders of magnitude
    half = warm_start_records(rows, 2, rescale_share=0.5, seed=1)
    changed = sum(h != p for h, p in zip(half, plain, strict=True))
    assert 0.25 * len(rows) < changed < 0.75 * len(rows)
    assert warm_start_records(rows[::-1], 2, rescale_share=0.5, seed=1)[::-1] == half


def test_a_row_whose_prompt_lacks_its_printed_series_cannot_be_reversed():
    from captionrl.train.warm_start import reversed_prompt

    row = {"item_id": "x", "series_text": "1.00, 2.00", "prompt": [{"role": "user", "content": "no series here"}]}
    with pytest.raises(ValueError, match="row x: the printed series is in 0 prompt messages"):
        reversed_prompt(row)


def test_freezing_the_bottom_blocks_is_undone_after_the_warm_start(tiny_llama):
    """``frozen_bottom``: inside, the embeddings and the bottom blocks take no gradient and the rest do;
    after, every weight trains again; more blocks than the model has is refused, naming the setting."""
    from transformers import AutoModelForCausalLM

    from captionrl.train.run.freezing import frozen_bottom, transformer_blocks

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    blocks = transformer_blocks(model)
    total = sum(p.numel() for p in model.parameters())
    with frozen_bottom(model, 1) as trainable:
        assert not any(p.requires_grad for p in model.get_input_embeddings().parameters())
        assert not any(p.requires_grad for p in blocks[0].parameters())
        assert all(p.requires_grad for p in blocks[-1].parameters())
        assert 0 < trainable < total
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ConfigError) as err, frozen_bottom(model, len(blocks) + 1, field="train.freeze_layers"):
        pass
    assert err.value.field == "train.freeze_layers"
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.slow
def test_a_run_warm_starts_before_rl_and_a_rerun_does_not_train_it_again(tmp_path, embedded_backend, tiny_llama):
    from captionrl.train import lineup
    from test_train_lineup import TINY

    out = tmp_path / "run"
    over = [*TINY, f"policy.model={tiny_llama}", f"train.out_dir={out}", "warm_start.epochs=1",
            "warm_start.batch_size=2", "warm_start.freeze_layers=1",  # the tiny policy has 2 blocks
            "eval.compare_initial=true", "eval.controls=false",  # the final checks' three systems, verdict included
            "train.beta=0.1", "warm_start.learning_rate=1.0e-2"]  # a KL term, and a warm start that moves the weights
    cfg = load_config(LineupConfig, CPU, over)
    result = lineup.run(cfg, verifier=embedded_backend)
    warm = json.loads((out / "result.json").read_text())["warm_start"]
    assert warm["steps"] == 2 and warm["train_loss"] > 0  # 4 windows, 2 a step
    # the KL reference is the warm start (anchor_reference): 0 before the first RL update; the base model,
    # which the warm start moved away from, would make it positive
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and abs(first["kl"]) < 1e-3, first["kl"]
    targets = [json.loads(line) for line in (out / "warm_start" / "targets.jsonl").read_text().splitlines()]
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    assert [t["caption"] for t in targets] == [
        short_description(printed_values(r), extremum=names_extremum(str(r["item_id"]), cfg.warm_start.extremum_share,
                                                                     cfg.seed)) for r in rows]
    assert (out / "warm_start" / "model").is_dir() and result["steps"] == 2
    # a rerun of the finished run resumes RL from its checkpoint and leaves the warm start alone
    mtime = (out / "warm_start" / "sft_summary.json").stat().st_mtime
    again = load_config(LineupConfig, CPU, [*over, "train.max_steps=3"])
    store = out / "eval" / "reference_captions.jsonl"
    kept = [json.loads(line) for line in store.read_text().splitlines()]
    assert sorted(r["system"] for r in kept) == ["initial", "initial", "warm start", "warm start"]  # 2 windows each
    lineup.run(again, verifier=embedded_backend)
    assert (out / "warm_start" / "sft_summary.json").stat().st_mtime == mtime
    # ... and reads the reference models' held-out captions back instead of captioning again
    assert [json.loads(line) for line in store.read_text().splitlines()] == kept
    systems = json.loads((out / "eval" / "summary.json").read_text())
    assert {r["system"] for r in systems["rows"]} >= {"trained", "warm start", "initial"}


@pytest.mark.slow
def test_the_warm_start_teaches_the_embedded_captioner_to_write_the_targets(tmp_path):
    """Eight windows, three epochs at the CPU config's rate: greedy captions of those windows take the
    target's form and state a direction; the untrained captioner writes neither (so the test can fail)."""
    import torch

    from captionrl.train.lineup_eval import generate_captions
    from captionrl.train.run.loading import load_policy
    from captionrl.train.warm_start import warm_start

    cfg = load_config(LineupConfig, CPU, ["data.n_train=8", "data.n_test=4", "warm_start.epochs=3",
                                          "warm_start.batch_size=4", "train.threads=2", f"train.out_dir={tmp_path}"])
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    model, processing, _ = load_policy(cfg.policy)
    before = generate_captions(model, processing, rows, 40, False, "before")
    torch.manual_seed(0)
    warm_start(cfg, rows, model, processing, tmp_path)
    model.eval()
    after = generate_captions(model, processing, rows, 40, False, "after")
    series = {str(r["item_id"]): r["series"] for r in rows}
    form = [c.startswith("Overall, the series") and "It starts at" in c for c in after.values()]
    assert sum(form) >= 6, after
    assert sum(c.startswith("Overall, the series") for c in before.values()) == 0, before
    checks = description_checks(after, series, instruction=cfg.instruction())
    assert np.mean(list(checks["direction_stated"].values())) >= 0.75, after


def test_a_finished_warm_start_is_loaded_not_trained_again_and_keeps_no_checkpoint(tmp_path, tiny_llama, monkeypatch):
    """A rerun with the same settings and targets loads the saved weights (every one equal to the trained
    model's) without an SFT run; another learning rate trains again. The SFT checkpoint is gone once the
    model is saved."""
    import torch

    from captionrl.train import sft
    from captionrl.train.run.loading import load_policy
    from captionrl.train.warm_start import DONE, warm_start
    from test_train_lineup import TINY

    over = [*TINY, f"policy.model={tiny_llama}", f"train.out_dir={tmp_path}", "warm_start.epochs=1",
            "warm_start.batch_size=2", "warm_start.freeze_layers=1", "warm_start.learning_rate=1.0e-2"]
    cfg = load_config(LineupConfig, CPU, over)
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    model, processing, _ = load_policy(cfg.policy)
    first = warm_start(cfg, rows, model, processing, tmp_path)
    folder = tmp_path / "warm_start"
    assert (folder / DONE).is_file() and (folder / "model" / "config.json").is_file()
    assert not (folder / "checkpoints").exists()
    trained = {k: v.clone() for k, v in model.state_dict().items()}

    runs: list[int] = []
    sft_run = sft.run
    monkeypatch.setattr(sft, "run", lambda *a, **k: runs.append(1) or sft_run(*a, **k))
    fresh, processing, _ = load_policy(cfg.policy)
    assert any(not torch.equal(v, trained[k]) for k, v in fresh.state_dict().items())  # the warm start moved it
    again = warm_start(cfg, rows, fresh, processing, tmp_path)
    assert runs == [] and again["reused"] and again["steps"] == first["steps"] == 2
    assert all(torch.equal(v, trained[k]) for k, v in fresh.state_dict().items())

    other = load_config(LineupConfig, CPU, [*over, "warm_start.learning_rate=5.0e-3"])
    with pytest.raises(ConfigError) as err:  # another warm start in this folder: not trained over the finished one
        warm_start(other, rows, fresh, processing, tmp_path)
    assert err.value.field == "train.out_dir" and "differs from this run's in its warm_start settings" in err.value.problem
    elsewhere = load_config(LineupConfig, CPU, [*over, "warm_start.learning_rate=5.0e-3", f"train.out_dir={tmp_path / 'b'}"])
    third, processing, _ = load_policy(other.policy)
    assert "reused" not in warm_start(elsewhere, rows, third, processing, tmp_path / "b")
    assert runs == [1]


@pytest.mark.parametrize("draw", [["warm_start.extremum_share=0.5", "warm_start.extremum_draw=pass"],
                                  ["warm_start.rescale_share=1.0", "warm_start.rescale_draw=pass"]])
def test_a_warm_start_drawn_per_pass_takes_the_steps_of_its_epochs(tmp_path, tiny_llama, draw):
    """Per-pass targets are ``epochs`` copies of the windows, trained once: as many steps as ``epochs`` passes
    over one copy, every copy in the targets file. The frozen bottom's cache serves the prompts a pass shows
    again (the extremum drawn per pass) and is not built where every pass shows every window anew."""
    from captionrl.train.run.loading import load_policy
    from captionrl.train.warm_start import warm_start
    from test_train_lineup import TINY

    over = [*TINY, f"policy.model={tiny_llama}", f"train.out_dir={tmp_path}", "warm_start.epochs=3",
            "warm_start.batch_size=2", "warm_start.freeze_layers=1", *draw]
    cfg = load_config(LineupConfig, CPU, over)
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    model, processing, _ = load_policy(cfg.policy)
    summary = warm_start(cfg, rows, model, processing, tmp_path)
    assert summary["steps"] == 3 * -(-len(rows) // 2)
    targets = (tmp_path / "warm_start" / "targets.jsonl").read_text().splitlines()
    assert len(targets) == 3 * len(rows)
    cache = summary["frozen_bottom_cache"]
    assert (cache["served_batches"] > 0) if "warm_start.extremum_draw=pass" in draw else cache is None


def test_a_warm_start_finished_before_extremum_draw_existed_keeps_its_identity():
    """The identity leaves out ``extremum_draw`` (it acts through the targets, digested whole): the settings a
    warm start recorded before the field existed match the default's, while drawing per pass changes the targets."""
    from dataclasses import asdict

    from captionrl.records import digest
    from captionrl.train.warm_start import warm_start_identity

    cfg = load_config(LineupConfig, CPU, ["data.n_train=6", "data.n_test=4"])
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    records = warm_start_records(rows, 2, extremum_share=0.5, seed=cfg.seed)
    identity = warm_start_identity(cfg, records)
    before = {k: v for k, v in asdict(cfg.warm_start).items() if k not in ("from_run", "from_run_any_seed", "extremum_draw", "rescale_draw")}
    assert digest(identity["warm_start"]) == digest(before)
    per_pass = warm_start_records(rows, 2, extremum_share=0.5, seed=cfg.seed, passes=4, extremum_draw="pass")
    assert warm_start_identity(cfg, per_pass)["targets"] != identity["targets"]


def test_the_targets_are_rewritten_for_a_new_warm_start_and_an_interrupted_one_is_not_resumed_on_others(tmp_path):
    from captionrl.train.warm_start import write_targets

    rows = _rows(6)
    first = warm_start_records(rows, 2, seed=0)
    other = warm_start_records(rows, 2, seed=0, order="values_first")
    write_targets(tmp_path, first)
    write_targets(tmp_path, first)  # the same targets again (a resumed warm start)
    assert [json.loads(line) for line in (tmp_path / "targets.jsonl").read_text().splitlines()] == first
    write_targets(tmp_path, other)  # no checkpoint: a new warm start, taught the new targets only
    assert [json.loads(line)["caption"] for line in (tmp_path / "targets.jsonl").read_text().splitlines()] == [
        r["caption"] for r in other]
    (tmp_path / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    write_targets(tmp_path, other)  # an interrupted warm start of the same targets resumes
    with pytest.raises(ConfigError, match="was taught other targets") as err:
        write_targets(tmp_path, first)
    assert err.value.field == "train.out_dir"


def test_a_run_starts_from_another_runs_finished_warm_start_only_when_it_was_made_the_same_way(
        tmp_path, tiny_llama, monkeypatch):
    """``warm_start.from_run``: the finished warm start of another run folder is copied in and loaded (no SFT
    run, every weight equal); one trained with another setting or seed, or a folder without a finished warm
    start, is refused naming what differs."""
    import torch

    from captionrl.train import sft
    from captionrl.train.run.loading import load_policy
    from captionrl.train.warm_start import DONE, warm_start
    from test_train_lineup import TINY

    base = [*TINY, f"policy.model={tiny_llama}", "warm_start.epochs=1", "warm_start.batch_size=2",
            "warm_start.freeze_layers=1", "warm_start.learning_rate=1.0e-2"]
    first_out, second_out = tmp_path / "main", tmp_path / "control"
    cfg = load_config(LineupConfig, CPU, [*base, f"train.out_dir={first_out}"])
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    model, processing, _ = load_policy(cfg.policy)
    warm_start(cfg, rows, model, processing, first_out)
    trained = {k: v.clone() for k, v in model.state_dict().items()}

    runs: list[int] = []
    sft_run = sft.run
    monkeypatch.setattr(sft, "run", lambda *a, **k: runs.append(1) or sft_run(*a, **k))
    control = load_config(LineupConfig, CPU, [*base, f"train.out_dir={second_out}", "reward.lam=0.0",
                                              f"warm_start.from_run={first_out}"])
    fresh, processing, _ = load_policy(control.policy)
    got = warm_start(control, rows, fresh, processing, second_out)
    assert runs == [] and got["from_run"] == str(first_out / "warm_start")
    assert all(torch.equal(v, trained[k]) for k, v in fresh.state_dict().items())
    assert (second_out / "warm_start" / DONE).is_file() and (second_out / "warm_start" / "model" / "config.json").is_file()

    other_rate = load_config(LineupConfig, CPU, [*base, f"train.out_dir={tmp_path / 'x'}",
                                                 "warm_start.learning_rate=5.0e-3", f"warm_start.from_run={first_out}"])
    with pytest.raises(ConfigError, match="warm_start settings") as err:
        warm_start(other_rate, rows, fresh, processing, tmp_path / "x")
    assert err.value.field == "warm_start.from_run"
    assert err.value.problem == "its warm start differs in its warm_start settings"
    other_seed = load_config(LineupConfig, CPU, [*base, f"train.out_dir={tmp_path / 'y'}", "seed=1",
                                                 f"warm_start.from_run={first_out}"])
    seed_rows = build_lineup_data(other_seed.data, other_seed.reward.k, other_seed.seed).rows["train"]
    with pytest.raises(ConfigError) as err:
        warm_start(other_seed, seed_rows, fresh, processing, tmp_path / "y")
    assert err.value.problem.startswith("its warm start differs in its seed, training windows")

    shared = load_config(LineupConfig, CPU, [*base, f"train.out_dir={tmp_path / 'y'}", "seed=1",
                                             f"warm_start.from_run={first_out}", "warm_start.from_run_any_seed=true"])
    other, processing, _ = load_policy(shared.policy)
    got = warm_start(shared, seed_rows, other, processing, tmp_path / "y")  # one warm start shared across seeds
    assert runs == [] and got["from_run"] == str(first_out / "warm_start")
    assert all(torch.equal(v, trained[k]) for k, v in other.state_dict().items())
    record = json.loads((tmp_path / "y" / "warm_start" / DONE).read_text())
    assert record["identity"]["seed"] == 1 and record["summary"]["from_seed"] == 0  # this run's, and whose it is
    again, processing, _ = load_policy(shared.policy)
    assert warm_start(shared, seed_rows, again, processing, tmp_path / "y")["reused"] and runs == []  # a rerun
    shared_other_rate = load_config(LineupConfig, CPU, [*base, f"train.out_dir={tmp_path / 'w'}", "seed=1",
                                                        "warm_start.learning_rate=5.0e-3", f"warm_start.from_run={first_out}",
                                                        "warm_start.from_run_any_seed=true"])
    with pytest.raises(ConfigError, match="differs in its warm_start settings") as err:
        warm_start(shared_other_rate, seed_rows, fresh, processing, tmp_path / "w")
    assert err.value.field == "warm_start.from_run"
    (tmp_path / "empty").mkdir()
    nothing = load_config(LineupConfig, CPU, [*base, f"warm_start.from_run={tmp_path / 'empty'}"])
    with pytest.raises(ConfigError, match="no finished warm start"):
        warm_start(nothing, rows, fresh, processing, tmp_path / "z")
    assert runs == []


@pytest.mark.parametrize("override, problem", [
    (["warm_start.epochs=0", "warm_start.from_run=."], "is set but the warm start is off"),
    (["warm_start.from_run=/no/such/run"], "is not a folder"),
    (["warm_start.from_run_any_seed=true"], "is set without from_run"),
])
def test_warm_start_from_run_is_checked_on_load(override, problem):
    with pytest.raises(ConfigError, match=problem) as err:
        load_config(LineupConfig, CPU, override)
    assert err.value.field == override[-1].split("=")[0]


def test_saved_weights_that_do_not_fit_the_policy_are_not_loaded(tmp_path, tiny_llama):
    """``load_warm_weights``: no files, a missing weight or another shape leave the policy untouched (False);
    the policy's own weights load (True)."""
    import torch
    from safetensors.torch import save_file

    from captionrl.train.run.loading import load_policy
    from captionrl.train.warm_start import load_warm_weights

    cfg = load_config(LineupConfig, CPU, [f"policy.model={tiny_llama}"])
    model, _, _ = load_policy(cfg.policy)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saved = {k: (v + 1.0).contiguous() for k, v in before.items() if k != "lm_head.weight"}
    assert not load_warm_weights(model, tmp_path)  # no safetensors file
    name = next(iter(saved))
    for broken in ({k: v for k, v in saved.items() if k != name},
                   {**saved, name: torch.zeros(3, 3)}):
        save_file(broken, str(tmp_path / "model.safetensors"))
        assert not load_warm_weights(model, tmp_path)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    save_file(saved, str(tmp_path / "model.safetensors"))
    assert load_warm_weights(model, tmp_path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())

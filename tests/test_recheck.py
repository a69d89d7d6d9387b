"""``captionrl eval recheck``: finished runs' held-out captions judged again by today's final checks.

Each run folder is written by the code that writes a real one (no training): ``save_config`` writes its
``config.yaml``, ``run_identification`` (with the code-checked claims verifier, no model) its
``eval/records.jsonl``, and ``run_final_checks`` its ``eval/final_checks.json``, whose verdict is then set to
what an older version of the checks could have said."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from captionrl.cli import main
from captionrl.config import load_config, save_config
from captionrl.domains.describe import describe_series
from captionrl.domains.lineup_data import build_lineup_data
from captionrl.eval.final_checks import run_final_checks
from captionrl.eval.identification import CaptionSet, IdentifyEvalConfig, run_identification
from captionrl.eval.recheck import recheck
from captionrl.judges.claims_verifier import parse_claims_spec
from captionrl.train.lineup_config import LineupConfig

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ["data.window=16", "data.n_test=24", "data.n_train=8", "data.series=[co2,nile,sunspots,elec_equip]",
            "reward.k=4", "seed=3"]
SILENT = "These are the values of a series over time."
RISING = ["Overall, the series is increasing.", "The value keeps increasing over time.",
          "The series increases over the window.", "Looking at the values, the series rises."]


@pytest.fixture(scope="module")
def held_out() -> dict[str, np.ndarray]:
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", SETTINGS)
    data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
    return {r["item_id"]: np.asarray(data.pool[r["item_id"]].values, dtype=float) for r in data.rows["test"]}


def finished_run(folder: Path, held_out: dict[str, np.ndarray], captions: dict[str, dict[str, str]],
                 then: str, settings: tuple[str, ...] = ()) -> Path:
    """A LineupRL run folder with the files its end writes; its saved verdict says ``then``."""
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml",
                      [*SETTINGS, *settings, f"train.out_dir={folder}"])
    save_config(cfg, folder / "config.yaml")
    data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
    items = [data.pool[r["item_id"]] for r in data.rows["test"]]
    distractors = {r["item_id"]: list(r["candidate_ids"][1:]) for r in data.rows["test"]}
    run_identification(items, [CaptionSet(name, caps) for name, caps in captions.items()], distractors, data.pool,
                       {"claims": parse_claims_spec("claims:rules")},
                       IdentifyEvalConfig(modes=["likelihood"], directions=["c2s"], ks=[4], controls=True),
                       folder / "eval")
    run_final_checks(captions, held_out, folder / "eval", instruction=cfg.instruction(),
                     tolerance=cfg.reward.factuality_tolerance)
    path = folder / "eval" / "final_checks.json"
    final = json.loads(path.read_text())
    final["verdict"]["outcome"] = then
    path.write_text(json.dumps(final))
    return folder


def test_a_run_is_judged_again_on_its_own_windows(tmp_path, held_out):
    """An honest captioner against a silent one is better whatever its old verdict said; one direction said of
    every window in varied words is not, although its direction is right about many windows."""
    silent = dict.fromkeys(held_out, SILENT)
    honest = finished_run(tmp_path / "honest", held_out, {"trained": {i: describe_series(v) for i, v in held_out.items()},
                                                           "initial": silent}, then="not better")
    rising = finished_run(tmp_path / "rising", held_out, {"trained": {i: RISING[k % 4] for k, i in enumerate(held_out)},
                                                           "initial": silent}, then="better")
    good = recheck(honest)
    assert (good["then"], good["now"]) == ("not better", "better")
    assert good["differences"]["trained - initial"]["direction_skill"] > 0.3
    guess = recheck(rising)
    assert guess["then"] == "better" and guess["now"] != "better", guess["verdict"]["line"]
    diffs = guess["differences"]["trained - initial"]
    assert diffs["direction_right"] > 0 and abs(diffs["direction_skill"]) < 0.1


def test_runs_are_aggregated_with_an_interval_and_a_warm_start_column(tmp_path, held_out, capsys):
    """Three warm-started seeds: the table says trained minus initial and trained minus the warm start per run,
    and over the runs each difference's mean with its 95% interval; ``--out`` writes the same."""
    silent = dict.fromkeys(held_out, SILENT)
    flat = {i: f"Overall, the series stays roughly flat. It starts at {v[0]:.2f} and ends at {v[-1]:.2f}."
            for i, v in held_out.items()}
    honest = {i: describe_series(v) for i, v in held_out.items()}
    runs = [finished_run(tmp_path / f"seed-{s}", held_out, {"trained": honest, "initial": silent, "warm start": flat},
                         then="not better") for s in range(3)]
    assert main(["eval", "recheck", *map(str, runs), f"out={tmp_path / 'rechecked'}"]) == 0
    printed = capsys.readouterr().out
    assert "trained - initial" in printed and "trained - warm start" in printed
    assert "| over 3 run(s) | 0 better | 3 better |" in printed
    assert "verdicts now over 3 run(s): 3 better" in printed
    summary = json.loads((tmp_path / "rechecked" / "recheck.json").read_text())
    skill = summary["over_runs"]["trained - warm start"]["direction_skill"]
    assert skill["lo"] == skill["mean"] == skill["hi"] > 0.3  # three identical runs: no spread
    assert (tmp_path / "rechecked" / "recheck.md").read_text() == printed


def test_a_folder_that_is_no_finished_run_is_named(tmp_path, capsys):
    (tmp_path / "half" / "eval").mkdir(parents=True)
    (tmp_path / "half" / "config.yaml").write_text("data: {}\n")
    assert main(["eval", "recheck", str(tmp_path / "half")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: DataError: RUN_DIR=") and "eval/records.jsonl" in err and len(err.splitlines()) == 1
    assert main(["eval", "recheck"]) == 2
    assert "RUN_DIR" in capsys.readouterr().err


def test_each_run_is_compared_with_its_control_on_the_same_windows(tmp_path, held_out, capsys):
    """With controls, the run's trained captions are paired per window with its control's: an honest captioner
    over a control that says only start and end gains direction skill, in each run and over the runs."""
    silent = dict.fromkeys(held_out, SILENT)
    flat = {i: f"Overall, the series stays roughly flat. It starts at {v[0]:.2f} and ends at {v[-1]:.2f}."
            for i, v in held_out.items()}
    honest = {i: describe_series(v) for i, v in held_out.items()}
    runs, controls = [], []
    for s in range(2):
        runs.append(finished_run(tmp_path / f"s{s}", held_out, {"trained": honest, "initial": silent, "warm start": flat},
                                 then="better"))
        controls.append(finished_run(tmp_path / f"s{s}-ctl", held_out, {"trained": flat, "initial": silent,
                                                                         "warm start": flat}, then="not better",
                                     settings=("reward.lam=0.0",)))
    assert main(["eval", "recheck", *map(str, runs), f"controls=[{controls[0]},{controls[1]}]",
                 f"out={tmp_path / 'rechecked'}"]) == 0
    printed = capsys.readouterr().out
    assert "trained - control" in printed
    summary = json.loads((tmp_path / "rechecked" / "recheck.json").read_text())
    first = summary["runs"][0]
    assert first["control"] == str(controls[0])
    assert first["differences"]["trained - control"]["direction_skill"] > 0.3
    lo, hi = first["intervals"]["trained - control"]["direction_skill"]
    assert 0 < lo <= first["differences"]["trained - control"]["direction_skill"] <= hi
    assert summary["over_runs"]["trained - control"]["direction_skill"]["lo"] > 0.3
    # the control judged by the control's own records: trained minus control equals warm start minus control's
    # trained here, which say the same flat sentence
    assert first["differences"]["trained - control"] == first["differences"]["trained - warm start"]


def test_a_control_on_other_windows_or_a_missing_control_is_named(tmp_path, held_out, capsys):
    silent = dict.fromkeys(held_out, SILENT)
    run = finished_run(tmp_path / "s3", held_out, {"trained": silent, "initial": silent}, then="not better")
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", [*SETTINGS, "seed=4"])
    other = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
    theirs = {r["item_id"]: np.asarray(other.pool[r["item_id"]].values, dtype=float) for r in other.rows["test"]}
    assert set(theirs) != set(held_out) or any((theirs[i] != held_out[i]).any() for i in theirs)
    elsewhere = finished_run(tmp_path / "s4", theirs, {"trained": dict.fromkeys(theirs, SILENT),
                                                        "initial": dict.fromkeys(theirs, SILENT)},
                             then="not better", settings=("seed=4",))
    capsys.readouterr()  # the progress bars of writing the two runs
    assert main(["eval", "recheck", str(run), f"controls=[{elsewhere}]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: DataError: controls=") and "same seed" in err
    assert main(["eval", "recheck", str(run), str(run), f"controls=[{elsewhere}]"]) == 2
    err = capsys.readouterr().err
    assert "controls" in err and "one control per run" in err

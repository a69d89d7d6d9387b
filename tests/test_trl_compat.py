"""Every private TRL name captionrl patches or reads still exists, takes the parameters the patch passes and
contains the code the patch relies on (``train.run.trl_compat``): a TRL release that changes one fails here,
naming the attribute and the TRL version, instead of breaking a run (or, worse, its numbers) silently."""

from __future__ import annotations

import pytest

from captionrl.train.run import trl_compat
from captionrl.train.run.trl_compat import Internal


def test_every_declared_internal_holds_in_the_installed_trl():
    problems = trl_compat.check_all()
    assert not problems, "\n".join(problems)


def test_the_patch_modules_use_only_declared_internals():
    """The names the patch modules wrap are all declared (so the check above covers them)."""
    import inspect
    import re

    from captionrl.train.run import callbacks, on_policy, shared_prefix, timing, unscored

    declared = {i.name for i in trl_compat.INTERNALS} | {i.owner for i in trl_compat.INTERNALS}
    for module in (on_policy, shared_prefix, unscored, timing, callbacks):
        text = inspect.getsource(module)
        used = set(re.findall(r'original\(\w+, "(\w+)"\)', text)) | set(re.findall(r'trl_object\("([\w.]+)"\)', text))
        assert used <= declared, (module.__name__, used - declared)
    assert "from trl.trainer" not in inspect.getsource(callbacks)  # internal paths go through trl_compat


@pytest.mark.parametrize("internal, expected", [
    (Internal("RLOOTrainer", "_compute_loss_renamed", "a test"), "RLOOTrainer._compute_loss_renamed is gone"),
    (Internal("RLOOTrainer", "_compute_loss", "a test", params=("inputs", "model")), "takes ('model', 'inputs')"),
    (Internal("RLOOTrainer", "_compute_loss", "a test", source=('inputs.get("old_logps")',)), "no longer contains"),
    (Internal("trl.trainer.utils.NoSuchSampler", None, "a test"), "trl.trainer.utils.NoSuchSampler is gone"),
])
def test_a_changed_internal_is_reported_with_its_name_and_the_trl_version(internal, expected):
    import trl

    (problem,) = trl_compat.problems(internal)
    assert expected in problem and f"TRL {trl.__version__}" in problem and "a test" in problem


def test_original_refuses_undeclared_and_missing_names():
    class _Trainer:
        def _compute_loss(self, model, inputs):
            return 0

    assert trl_compat.original(_Trainer(), "_compute_loss")(None, {}) == 0
    with pytest.raises(RuntimeError, match="not a declared TRL internal"):
        trl_compat.original(_Trainer(), "_undeclared")
    with pytest.raises(RuntimeError, match=r"_Trainer\._generate does not exist in TRL .*trl>=1\.16,<1\.17"):
        trl_compat.original(_Trainer(), "_generate")


def test_register_adds_a_patch_modules_internals_once():
    extra = Internal("GRPOTrainer", "_get_per_token_logps_and_entropies", "a test patch",
                     params=("model", "input_ids", "attention_mask", "logits_to_keep"))
    before = list(trl_compat.INTERNALS)
    try:
        trl_compat.register(extra, extra)
        assert trl_compat.INTERNALS.count(extra) == 1 and not trl_compat.problems(extra)
    finally:
        trl_compat.INTERNALS[:] = before


def test_the_trl_pin_matches_the_checked_release():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"{trl_compat.TRL_PIN}"' in text and f"trl>={trl_compat.CHECKED_TRL}," in trl_compat.TRL_PIN


def test_on_policy_inputs_give_the_loss_pass_logps_to_get_as_well_as_to_indexing():
    """If TRL read ``old_logps`` with ``.get``, it must still get the loss pass's own log-probs, never the
    placeholder zeros the skipped pass returned."""
    import torch

    from captionrl.train.run.on_policy import _OldLogpsFromLoss

    per_token = torch.tensor([[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    inputs = _OldLogpsFromLoss({"completion_mask": mask, "old_logps": torch.zeros(2)}, {"per_token_logps": per_token})
    expected = torch.tensor([-0.5, 1.0])
    assert torch.equal(inputs["old_logps"], expected) and torch.equal(inputs.get("old_logps"), expected)
    assert not inputs.get("old_logps").requires_grad  # detached: the ratio's denominator carries no gradient
    assert inputs.get("absent", "default") == "default"

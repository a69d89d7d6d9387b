"""Unscored samples leave no trace in the loss (``train.run.unscored``): a batch in which some samples' every
reward is ``None`` gives the loss and the gradients of the same batch without those samples.

One real generation batch of the tiny random Llama (``captionrl.testing.tiny_llama``: TRL's mechanics, not a
model) per recipe setting, built through ``builder.build_trainer`` (so every other patch of a real run is
on): 2 prompts x G=4, two micro-batches of 4 (gradient accumulation 2, one generation batch per optimizer
step), and the reward leaves samples 1 and 2 unscored (both in the first group and the first micro-batch:
the micro-batches are uneven). The same batch is then scored three ways over one optimizer step's
micro-batches, summing the gradients as the Trainer does:

- *fixed*: the batch the patched trainer returns;
- *absent*: TRL's own batch with the two samples removed (6 rows, 3 per micro-batch), its token count
  recounted as TRL counts it: what a run in which those samples never existed computes;
- *TRL as is*: TRL's own batch, unscored samples included: the dilution the patch removes (it must differ,
  so the comparison is not vacuous).
"""

from __future__ import annotations

import pytest
import torch

from captionrl.rewards import completion_text
from captionrl.train.run import builder, loading, sections
from captionrl.train.run.unscored import SCALE_KEY, normaliser, settings_problem

UNSCORED = (1, 2)
G, GA = 4, 2
EOS_BIAS = 9.0

CASES = {  # the recipes' settings: configs/lineup-{cpu,paper}.yaml, rubicap-cpu/moco-*.yaml, rubicap-paper.yaml
    "rloo": {"algorithm": "rloo", "beta": 0.0},
    "rloo-kl": {"algorithm": "rloo", "beta": 0.05},
    "grpo-dapo": {"algorithm": "grpo", "loss_type": "dapo", "beta": 0.0},
    "grpo-grpo-kl": {"algorithm": "grpo", "loss_type": "grpo", "beta": 0.04},
}


def rows():
    return [{"prompt": [{"role": "user", "content": f"Say a word about {w}."}]} for w in ("rain", "snow")]


class Reward:
    """Varied, deterministic rewards (characters used by the caption); ``None`` at the UNSCORED positions."""

    __name__ = "chars"

    def __init__(self, unscored=UNSCORED) -> None:
        self.unscored = unscored
        self.scores: list[float | None] = []

    def __call__(self, prompts=None, completions=(), **kw):
        self.scores = [None if i in self.unscored else len(set(completion_text(c))) / 10 for i, c in enumerate(completions)]
        return list(self.scores)


def build(tmp_path, name, policy, unscored=UNSCORED, **kw):
    from datasets import Dataset

    train = sections.TrainConfig(**{"out_dir": str(tmp_path / name), "num_generations": G,
                                    "per_device_train_batch_size": 4, "gradient_accumulation_steps": GA,
                                    "max_completion_length": 12, "max_steps": 1, "report_to": [],
                                    "temperature": 1.0, **kw})
    model, tok, _ = loading.load_policy(sections.PolicyConfig(model=policy))
    # captions of varied lengths (a random model rarely ends one): EOS made likely, so tokens are not rows
    train.generation_kwargs = {"sequence_bias": [[[tok.eos_token_id], EOS_BIAS]]}
    reward = Reward(unscored)
    trainer = builder.build_trainer(train, builder.trainer_args(train, seed=0), model, tok, [reward],
                                    Dataset.from_list(rows()))
    trainer.current_gradient_accumulation_steps = GA  # set by the training loop; the loss reads it
    trainer.model.train()
    if train.beta:  # a policy away from its reference, so the KL term (and its gradient) is not zero
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in trainer.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return trainer, reward


def without(batch, keep):
    """``batch`` with only the rows ``keep``; the token count recounted as TRL counts it (one process)."""
    n = batch["completion_ids"].size(0)
    out = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.ndim > 0 and v.size(0) == n:
            out[k] = v[keep]
        elif isinstance(v, list) and len(v) == n:
            out[k] = [v[i] for i in keep]
        else:
            out[k] = v
    out["num_items_in_batch"] = out["completion_mask"].sum()
    return out


def one_step(trainer, batch):
    """Loss and summed gradients of one optimizer step over ``batch`` split into GA micro-batches, scaled
    for accumulation as the Trainer scales them (GRPO scales inside its loss, RLOO's loss is divided)."""
    from trl.trainer.utils import split_tensor_dict

    model = trainer.model
    model.zero_grad(set_to_none=True)
    total = 0.0
    for chunk in split_tensor_dict(batch, GA):
        loss = trainer.compute_loss(model, chunk)
        if not trainer.loss_is_scaled_for_ga:
            loss = loss / GA
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return total, grads


def gap(a, b):
    """Largest gradient difference relative to the largest gradient entry."""
    scale = max(g.abs().max().item() for g in b.values())
    return max((a[n] - b[n]).abs().max().item() for n in b) / scale


def expected_advantages(algorithm, scores):
    """Advantages of the scored samples computed from their rewards alone (as if the others never existed)."""
    out = {}
    for start in range(0, len(scores), G):
        idx = [i for i in range(start, start + G) if scores[i] is not None]
        r = torch.tensor([scores[i] for i in idx], dtype=torch.float64)
        if algorithm == "grpo":
            adv = (r - r.mean()) / (r.std() + 1e-4)
        else:
            adv = torch.stack([r[j] - (r.sum() - r[j]) / (len(idx) - 1) for j in range(len(idx))])
        out.update(dict(zip(idx, adv.tolist(), strict=True)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_unscored_samples_give_the_loss_and_gradients_of_the_batch_without_them(tmp_path, tiny_llama, case):
    settings = CASES[case]
    trainer, reward = build(tmp_path, case, tiny_llama, **settings)
    assert trainer._captionrl_unscored["normaliser"] == normaliser(trainer)
    batch = [rows()[0]] * G + [rows()[1]] * G
    torch.manual_seed(0)
    trl_batch = type(trainer)._generate_and_score_completions(trainer, batch)  # TRL's own, unpatched
    torch.manual_seed(0)
    fixed_batch = trainer._generate_and_score_completions(batch)
    assert torch.equal(trl_batch["completion_ids"], fixed_batch["completion_ids"])  # the same samples
    assert [i for i, s in enumerate(reward.scores) if s is None] == list(UNSCORED)
    assert trainer._captionrl_unscored["samples"] == len(UNSCORED)
    keep = [i for i in range(2 * G) if i not in UNSCORED]
    lengths = trl_batch["completion_mask"].sum(1).tolist()
    assert len(set(lengths)) > 2, lengths  # a token count is not a row count here

    if settings["beta"] == 0.0 or settings["algorithm"] == "grpo":  # TRL's baselines already leave them out
        want = expected_advantages(settings["algorithm"], reward.scores)
        got = fixed_batch["advantages"].tolist()
        assert all(abs(got[i] - want[i]) < 1e-4 for i in keep), (got, want)
        assert all(got[i] == 0.0 for i in UNSCORED)

    fixed_loss, fixed = one_step(trainer, fixed_batch)
    absent_loss, absent = one_step(trainer, without(trl_batch, keep))
    trl_loss, trl = one_step(trainer, trl_batch)
    diff, dilution = gap(fixed, absent), gap(trl, absent)
    print(f"{case}: lengths {lengths}; loss fixed {fixed_loss:.6g} absent {absent_loss:.6g} TRL {trl_loss:.6g}; "
          f"gradient gap fixed-absent {diff:.2e}, TRL-absent {dilution:.2e}")
    assert abs(fixed_loss - absent_loss) <= 1e-5 * max(1.0, abs(absent_loss))
    assert diff < 1e-4, f"gradients differ from the batch without the unscored samples by {diff:.2e}"
    assert dilution > 0.02, "TRL's own loss should be diluted by the unscored samples (the case tests nothing)"


@pytest.mark.slow
def test_a_batch_without_unscored_samples_is_left_as_trl_returns_it(tmp_path, tiny_llama):
    trainer, _ = build(tmp_path, "clean", tiny_llama, (), algorithm="grpo", loss_type="grpo", beta=0.0)
    batch = [rows()[0]] * G + [rows()[1]] * G
    torch.manual_seed(0)
    trl_batch = type(trainer)._generate_and_score_completions(trainer, batch)
    torch.manual_seed(0)
    fixed_batch = trainer._generate_and_score_completions(batch)
    assert SCALE_KEY not in fixed_batch and trainer._captionrl_unscored["samples"] == 0
    assert torch.equal(trl_batch["completion_mask"], fixed_batch["completion_mask"])
    assert int(trl_batch["num_items_in_batch"]) == int(fixed_batch["num_items_in_batch"])


def test_an_entropy_bonus_with_a_row_normalised_loss_is_refused():
    from captionrl.errors import ConfigError

    assert settings_problem("grpo", "dapo", 0.01, False) is None
    assert settings_problem("grpo", "grpo", 0.0, False) is None
    with pytest.raises(ConfigError, match=r"train\.entropy_coef"):
        sections.GRPOTrainConfig(loss_type="grpo", entropy_coef=0.01)

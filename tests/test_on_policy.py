"""RLOO on-policy shortcut: skipping TRL's old-policy pass changes nothing but the work done.

Two real 1-step RLOO runs of a tiny random SmolLM2-shaped policy (the embedded tokenizer and chat template,
``captionrl.testing.tiny_llama``; the check is about TRL's mechanics, not the model) from the same seed and
data, one with TRL's pass and one without, sample the same captions and move the weights the same way (AdamW's first step is about
``lr * sign(grad)``, so a wrong gradient shows as an lr-sized difference); only the patched trainer skips
the no-grad pass. Off-policy settings (mu > 1, a KL term, GRPO) keep TRL's pass.
"""

from __future__ import annotations

import pytest
import torch

from captionrl.rewards import completion_text
from captionrl.train.run import builder, loading, sections
from captionrl.train.run.on_policy import on_policy_reason, reuse_on_policy_logprobs

pytestmark = pytest.mark.slow

LR = 1e-4


def distinct_words(prompts=None, completions=(), **kw):
    """A deterministic text reward (distinct words, capped): the same captions get the same rewards."""
    return [min(len(set(completion_text(c).lower().split())), 12) / 12 for c in completions]


distinct_words.__name__ = "distinct_words"


def data():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Say a word about {w}."}]
                                         for w in ("rain", "snow")]})


def train_config(tmp_path, name: str, **kw) -> sections.TrainConfig:
    base = {"algorithm": "rloo", "out_dir": str(tmp_path / name), "num_generations": 4,
            "per_device_train_batch_size": 8, "max_completion_length": 12, "max_steps": 1, "save_steps": 100,
            "beta": 0.0, "report_to": [], "learning_rate": LR, "temperature": 1.0}
    return sections.TrainConfig(**{**base, **kw})


def one_step(tmp_path, policy: str, name: str, skip: bool) -> tuple[dict[str, torch.Tensor], dict, list[str]]:
    train = train_config(tmp_path, name)
    model, tok, _ = loading.load_policy(sections.PolicyConfig(model=policy))
    args = builder.trainer_args(train, seed=0)
    from trl import RLOOTrainer

    captions: list[str] = []

    def reward(prompts=None, completions=(), **kw):
        captions.extend(completion_text(c) for c in completions)
        return distinct_words(prompts, completions)

    reward.__name__ = "distinct_words"
    trainer = RLOOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=data(), processing_class=tok)
    state = None
    if skip:
        assert reuse_on_policy_logprobs(trainer) is not None
        state = trainer._captionrl_on_policy
    torch.manual_seed(0)
    trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return params, (state or {}), captions


def test_skipping_the_old_policy_pass_gives_the_same_update(tmp_path, tiny_llama):
    model0, _, _ = loading.load_policy(sections.PolicyConfig(model=tiny_llama))
    initial = {n: p.detach().clone() for n, p in model0.named_parameters()}
    del model0
    plain, _, plain_captions = one_step(tmp_path, tiny_llama, "plain", skip=False)
    fast, state, fast_captions = one_step(tmp_path, tiny_llama, "fast", skip=True)

    assert state["skipped"] == 1  # one generation batch, one skipped no-grad pass
    assert fast_captions == plain_captions and len(set(plain_captions)) > 1  # same samples, varied rewards
    moved = max((plain[n] - initial[n]).abs().max().item() for n in initial)
    assert moved > 0.5 * LR  # the step did move the weights (AdamW's first step ~ lr * sign(grad))
    diff = max(((fast[n] - initial[n]) - (plain[n] - initial[n])).abs().max().item() for n in initial)
    assert diff < 0.05 * LR, f"updates differ by {diff:.3g} (lr {LR})"


def test_off_policy_settings_keep_trls_pass(tmp_path, tiny_llama):
    from trl import GRPOTrainer, RLOOTrainer

    model, tok, _ = loading.load_policy(sections.PolicyConfig(model=tiny_llama))
    cases = {
        "mu2": (RLOOTrainer, {"num_iterations": 2}),
        "kl": (RLOOTrainer, {"beta": 0.05}),
        "two_steps_per_generation": (RLOOTrainer, {"steps_per_generation": 2, "per_device_train_batch_size": 4}),
        "grpo": (GRPOTrainer, {"algorithm": "grpo"}),
    }
    for name, (cls, kw) in cases.items():
        train = train_config(tmp_path, name, **kw)
        trainer = cls(model=model, reward_funcs=[distinct_words], args=builder.trainer_args(train, seed=0),
                      train_dataset=data(), processing_class=tok)
        assert on_policy_reason(trainer) is None, name
        assert reuse_on_policy_logprobs(trainer) is None and not hasattr(trainer, "_captionrl_on_policy"), name
    on_policy = RLOOTrainer(model=model, reward_funcs=[distinct_words],
                            args=builder.trainer_args(train_config(tmp_path, "on"), seed=0),
                            train_dataset=data(), processing_class=tok)
    assert "on-policy" in (on_policy_reason(on_policy) or "")

"""The TRL trainer and arguments RLOO / GRPO actually build (``train/common.py``), and a real run with a
KL term (``beta > 0``): the reference model is built and TRL logs the KL it adds."""

from __future__ import annotations

from pathlib import Path

import pytest

from captionrl.errors import ConfigError
from captionrl.train.common import TrainConfig, build_trainer, trainer_args

ROOT = Path(__file__).resolve().parents[1]


def _train(**kw):
    base = {"num_generations": 2, "per_device_train_batch_size": 4, "max_completion_length": 16, "max_steps": 3,
            "report_to": [], "out_dir": "runs/x"}
    return TrainConfig(**{**base, **kw})


def test_rloo_builds_rlooconfig_with_every_key_setting():
    from trl import RLOOConfig

    args = trainer_args(_train(algorithm="rloo", beta=0.07, learning_rate=3e-6, temperature=0.7, epsilon=0.1,
                               normalize_advantages=True), seed=11, reward_weights=[1.0, 0.5])
    assert type(args) is RLOOConfig
    assert (args.beta, args.num_generations, args.normalize_advantages) == (0.07, 2, True)
    assert (args.learning_rate, args.temperature, args.epsilon, args.max_completion_length) == (3e-6, 0.7, 0.1, 16)
    assert (args.seed, args.data_seed, args.max_steps, args.reward_weights) == (11, 11, 3, [1.0, 0.5])
    assert args.remove_unused_columns is False and args.disable_dropout is True
    assert Path(args.output_dir) == Path("runs/x") / "checkpoints"
    assert not hasattr(args, "loss_type") or args.loss_type != "dr_grpo"  # no GRPO setting leaks in


def test_grpo_builds_grpoconfig_with_its_own_defaults_and_extras():
    from trl import GRPOConfig

    args = trainer_args(_train(algorithm="grpo", loss_type="grpo", scale_rewards="batch",
                               extra={"top_k": 5}), seed=0)
    assert type(args) is GRPOConfig
    assert (args.beta, args.loss_type, args.scale_rewards, args.top_k) == (0.0, "grpo", "batch", 5)
    with pytest.raises(ConfigError, match=r"train\.extra\.top_kk.*top_k"):
        trainer_args(_train(algorithm="grpo", extra={"top_kk": 5}), seed=0)
    with pytest.raises(ConfigError, match="TRL rejected"):
        trainer_args(_train(algorithm="grpo", extra={"generation_batch_size": 3}), seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, beta", [("rloo", 0.05), ("grpo", 0.0), ("grpo", 0.04)])
def test_build_trainer_returns_the_algorithms_trainer(algorithm, beta, tmp_path):
    """A tiny random Llama with the embedded tokenizer: the class, beta and reference model TRL holds."""
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import GRPOTrainer, RLOOTrainer

    from captionrl.embedded import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))
    tiny.save_pretrained(tmp_path / "tiny")  # TRL rebuilds the reference model from the model's folder
    model = LlamaForCausalLM.from_pretrained(tmp_path / "tiny")
    train = _train(algorithm=algorithm, beta=beta, out_dir=str(tmp_path))
    trainer = build_trainer(train, trainer_args(train, seed=0), model, tok, [lambda completions, **kw: [1.0] * len(completions)],
                            Dataset.from_list([{"prompt": "Describe: 1, 2, 3"}] * 4))
    assert type(trainer) is (RLOOTrainer if algorithm == "rloo" else GRPOTrainer)
    assert trainer.beta == beta and trainer.num_generations == 2
    assert (trainer.ref_model is not None) == (beta > 0)  # beta > 0 builds the frozen reference policy


@pytest.mark.slow
def test_a_real_rloo_run_with_a_kl_term_logs_it(tmp_path, embedded_backend):
    from captionrl.config import load_config
    from captionrl.train import lineup
    from captionrl.train.curves import load_metrics
    from captionrl.train.lineup import LineupConfig

    out = tmp_path / "run"
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", [
        "data.window=8", "data.n_train=2", "data.n_test=2", "data.series=[nile,sunspots]", "reward.k=2",
        "reward.signal=soft", "train.algorithm=rloo", "train.num_generations=2", "train.per_device_train_batch_size=2",
        "train.max_completion_length=6", "train.max_steps=2", "train.save_steps=2", "train.learning_rate=1.0e-4",
        "train.beta=0.05", "train.report_to=[]", "train.threads=1", "eval.enabled=false", f"train.out_dir={out}"])
    assert cfg.train.beta == 0.05
    lineup.run(cfg, verifier=embedded_backend)
    metrics = load_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    kls = [m.get("kl") for m in metrics]
    assert all(isinstance(k, float) for k in kls), metrics  # logged only when TRL applies a KL term
    assert kls[0] == pytest.approx(0.0, abs=1e-4)  # the first batch is sampled from the reference itself
    assert kls[1] != pytest.approx(0.0, abs=1e-6)  # after one update at lr 1e-4 the policy has moved

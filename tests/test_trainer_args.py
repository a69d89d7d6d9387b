"""The TRL trainer and arguments RLOO / GRPO actually build (``train/run/builder.py``), and a real run with a
KL term (``beta > 0``): the reference model is built and TRL logs the KL it adds."""

from __future__ import annotations

from pathlib import Path

import pytest

from captionrl.errors import ConfigError
from captionrl.train.run.builder import build_trainer, trainer_args
from captionrl.train.run.sections import TrainConfig

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


def test_grpo_builds_grpoconfig_with_its_own_defaults_and_any_trl_field():
    from trl import GRPOConfig

    from captionrl.config import load_config
    from captionrl.train.lineup import LineupConfig

    args = trainer_args(_train(algorithm="grpo", loss_type="grpo", scale_rewards="batch", top_k=5), seed=0)
    assert type(args) is GRPOConfig
    assert (args.beta, args.loss_type, args.scale_rewards, args.top_k) == (0.0, "grpo", "batch", 5)
    with pytest.raises(ConfigError, match=r"train\.top_kk.*top_k"):  # an unknown key names the close TRL field
        load_config(LineupConfig, None, ["train.algorithm=grpo", "train.top_kk=5"])
    with pytest.raises(ConfigError, match="TRL rejected"):  # TRL's own validation, reported in our terms
        trainer_args(_train(algorithm="grpo", generation_batch_size=3), seed=0)


def test_the_train_section_is_trls_fields_with_our_overrides_in_one_place():
    """Every RLOOConfig / GRPOConfig field is a train setting with TRL's help; the defaults are TRL's except
    the overrides trl_settings declares (with their reason), and every value reaches TRL unchanged."""
    import dataclasses

    from trl import GRPOConfig, RLOOConfig

    from captionrl.train.run import trl_settings

    ours = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for cls in (RLOOConfig, GRPOConfig):
        missing = {f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")} - set(ours)
        assert missing <= set(trl_settings.SET_BY_CAPTIONRL), missing
    assert "Number of generations" in ours["num_generations"].metadata["help"]  # TRL's own help text
    assert "captionrl default 4" in ours["num_generations"].metadata["help"]
    rloo = dataclasses.fields(RLOOConfig)
    trl_default = {f.name: f.default for f in rloo}
    plain = ("epsilon", "temperature", "top_p", "max_grad_norm", "weight_decay", "warmup_steps", "adam_beta1",
             "num_iterations", "mask_truncated_completions")
    cfg = TrainConfig()
    assert all(getattr(cfg, n) == trl_default[n] for n in plain)  # not re-declared: TRL's defaults
    for name, (value, _why) in trl_settings.OVERRIDES.items():
        assert getattr(cfg, name) == value
    args = trainer_args(_train(algorithm="rloo", adam_beta2=0.98, warmup_steps=2), seed=0)
    assert (args.adam_beta2, args.warmup_steps, args.lr_scheduler_type.value) == (0.98, 2, "constant")


@pytest.mark.parametrize("config", ["lineup-cpu", "lineup-paper", "rubicap-cpu", "moco-cpu"])
def test_the_trainer_arguments_use_no_deprecated_setting(config):
    """A run prints no warning about our own settings: transformers renamed ``gradient_checkpointing`` to
    ``activation_checkpointing`` (the old name warns when given), and TRL's config classes default the old name
    to True, so the arguments must carry the current name (the warm start's SFT arguments too)."""
    import warnings

    from captionrl.config import load_config
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.moco import MocoConfig
    from captionrl.train.rubicap import RubicapConfig
    from captionrl.train.sft import SFTDataConfig, SFTRunConfig, sft_args

    cls = {"lineup": LineupConfig, "rubicap": RubicapConfig, "moco": MocoConfig}[config.split("-")[0]]
    cfg = load_config(cls, ROOT / "configs" / f"{config}.yaml", ["train.use_cpu=true", "train.bf16=false"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        args = trainer_args(cfg.train, seed=0)
        sft = sft_args(SFTRunConfig(data=SFTDataConfig(path="x.jsonl")), Path("runs/x"))
    wanted = bool(cfg.train.gradient_checkpointing)  # null: off on CPU
    assert args.gradient_checkpointing is wanted and getattr(args, "activation_checkpointing", wanted) is wanted
    assert sft.gradient_checkpointing is False


def test_a_setting_of_the_other_algorithm_is_refused_by_name():
    with pytest.raises(ConfigError) as err:
        _train(algorithm="rloo", scale_rewards="batch")
    assert err.value.field == "train.scale_rewards" and "GRPOConfig" in err.value.problem
    with pytest.raises(ConfigError) as err:
        _train(algorithm="grpo", normalize_advantages=True)
    assert err.value.field == "train.normalize_advantages"
    with pytest.raises(ConfigError, match="remove_unused_columns"):
        _train(remove_unused_columns=True)


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
def test_a_real_rloo_run_with_a_kl_term_logs_it(tmp_path, tiny_llama):
    """TRL's mechanics, not the model's: the tiny random SmolLM2-shaped policy (``captionrl.testing.tiny_llama``)
    trains, and the same tiny model in likelihood mode is the verifier (any caption-dependent reward gives
    RLOO an advantage; no real 135M loads)."""
    from captionrl.backends.hf import HFBackend
    from captionrl.config import load_config
    from captionrl.train import lineup
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.run.curves import load_metrics

    out = tmp_path / "run"
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", [
        "data.window=8", "data.n_train=2", "data.n_test=2", "data.series=[nile,sunspots]", "reward.k=2",
        "reward.signal=soft", "train.algorithm=rloo", "train.num_generations=2", "train.per_device_train_batch_size=2",
        "train.max_completion_length=6", "train.max_steps=2", "train.save_steps=2", "train.learning_rate=1.0e-4",
        "train.beta=0.05", "train.report_to=[]", "train.threads=1", "eval.enabled=false", f"train.out_dir={out}",
        f"policy.model={tiny_llama}", "train.preflight_items=0", "warm_start.epochs=0", "train.freeze_layers=0"])  # preflight: test_preflight.py
    assert cfg.train.beta == 0.05
    lineup.run(cfg, verifier=HFBackend(tiny_llama, dtype="float32"))
    metrics = load_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    kls = [m.get("kl") for m in metrics]
    assert all(isinstance(k, float) for k in kls), metrics  # logged only when TRL applies a KL term
    assert kls[0] == pytest.approx(0.0, abs=1e-4)  # the first batch is sampled from the reference itself
    assert kls[1] != pytest.approx(0.0, abs=1e-6)  # after one update at lr 1e-4 the policy has moved

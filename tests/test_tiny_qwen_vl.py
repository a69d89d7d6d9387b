"""Tiny Qwen2.5-VL / Qwen3-VL fixtures: built offline, real processor classes and chat templates, usable as
``tiny-qwen2.5-vl`` / ``tiny-qwen3-vl`` by the hf backend and as the policy of RubiCap (GRPO) and LineupRL
(RLOO, chart input) through TRL.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.errors import ConfigError
from presets import ON_CPU
from servers import requires_llama_cpp

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["qwen2.5-vl", "qwen3-vl"]


def _msgs(image, text="Describe this image."):
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]


# ---------------------------------------------------------------------- fast: no model
def test_bad_recipe_is_named():
    from captionrl.tiny_models.qwen_vl import tiny_qwen_vl_recipe

    with pytest.raises(ConfigError, match="family"):
        tiny_qwen_vl_recipe("qwen2-vl")
    with pytest.raises(ConfigError, match="hidden"):
        tiny_qwen_vl_recipe("qwen3-vl", hidden=40)


def test_backend_names_resolve_and_typos_are_named():
    from captionrl.backends import parse_backend_spec
    from captionrl.backends.hf import resolve_model_path

    for name in ("tiny-qwen2.5-vl", "hf:tiny-qwen3-vl,batch_size=2"):
        spec = parse_backend_spec(name)
        assert spec.kind == "hf" and spec.model.startswith("tiny-qwen")
    with pytest.raises(ConfigError, match=r"tiny-qwen2\.5-vl"):
        resolve_model_path("tiny-qwen2-vl")  # the error lists the names that exist


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_has_the_family_special_tokens_and_splits_digits(family):
    from transformers import Qwen2Tokenizer

    from captionrl.tiny_models.qwen_vl import SPECIAL_TOKENS, build_tokenizer

    tok = build_tokenizer(family)
    assert isinstance(tok, Qwen2Tokenizer)
    ids = tok.convert_tokens_to_ids(SPECIAL_TOKENS)
    assert ids == list(range(ids[0], ids[0] + len(SPECIAL_TOKENS)))  # one id each, in the family's order
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>peak 127<|im_end|>"
    pieces = tok.convert_ids_to_tokens(tok(text)["input_ids"])
    assert pieces[:2] == ["<|im_start|>", "user"] and pieces[-4:] == ["1", "2", "7", "<|im_end|>"]
    assert tok.decode(tok(text)["input_ids"]) == text
    assert (tok.convert_tokens_to_ids("<think>") is not None) == (family == "qwen3-vl")
    assert build_tokenizer(family).get_vocab() == tok.get_vocab()  # same text, same merges: reproducible


def test_chat_templates_render_the_family_format():
    from jinja2 import Environment

    from captionrl.tiny_models.qwen_vl import QWEN2_5_VL_CHAT_TEMPLATE, QWEN3_VL_CHAT_TEMPLATE

    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]},
            {"role": "assistant", "content": "A red circle."}]
    env = Environment()
    q25 = env.from_string(QWEN2_5_VL_CHAT_TEMPLATE).render(messages=msgs, add_generation_prompt=True)
    assert q25 == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n"
        "<|im_start|>assistant\nA red circle.<|im_end|>\n<|im_start|>assistant\n"
    )
    q3 = env.from_string(QWEN3_VL_CHAT_TEMPLATE).render(messages=msgs, add_generation_prompt=True)
    assert q3 == q25.split("<|im_end|>\n", 1)[1]  # Qwen3-VL: the same turns, no default system turn
    sys = [{"role": "system", "content": "Be brief."}, msgs[0]]
    assert env.from_string(QWEN3_VL_CHAT_TEMPLATE).render(messages=sys).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<|vision_start|>")


# ---------------------------------------------------------------------- slow: builds and loads models
@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    from captionrl.backends.hf import HFBackend

    backend = HFBackend(f"tiny-{request.param}", batch_size=4, dtype="float32")  # exact comparisons below
    backend._ensure_loaded()
    return request.param, backend


@pytest.mark.slow
@pytest.mark.gpu_pins
def test_folder_is_a_family_checkpoint_with_the_real_processor(tiny):
    import torch
    from PIL import Image
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil, Qwen3VLProcessor

    from captionrl.backends.hf import resolve_model_path

    family, backend = tiny
    folder = Path(resolve_model_path(f"tiny-{family}")[0])
    cfg = json.loads((folder / "config.json").read_text())
    arch = {"qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration", "qwen3-vl": "Qwen3VLForConditionalGeneration"}
    assert cfg["architectures"] == [arch[family]] and "vision_config" in cfg
    assert "NOT a model" in json.loads((folder / "captionrl_fixture.json").read_text())["fixture"]
    real = Qwen2_5_VLProcessor if family == "qwen2.5-vl" else Qwen3VLProcessor
    proc = backend._processor
    assert isinstance(proc, real) and isinstance(proc.image_processor, Qwen2VLImageProcessorPil)
    assert json.loads((folder / "processor_config.json").read_text())["processor_class"] == real.__name__
    assert proc.image_processor.patch_size == {"qwen2.5-vl": 14, "qwen3-vl": 16}[family]

    # the processor expands the template's one <|image_pad|> to (h/patch)*(w/patch)/merge**2 tokens
    text = backend.render_chat(_msgs(None))
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 1
    assert text.startswith("<|im_start|>system\n" if family == "qwen2.5-vl" else "<|im_start|>user\n")
    patch = proc.image_processor.patch_size
    for size, expected in (((64, 64), 4), ((4 * patch * 2, 2 * patch * 2), 8), ((400, 300), None)):
        enc = proc(text=[text], images=[Image.new("RGB", size, (200, 30, 30))], return_tensors="pt")
        t, h, w = enc["image_grid_thw"][0].tolist()
        n_pad = int((enc["input_ids"] == proc.image_token_id).sum())
        assert n_pad == t * h * w // 4 and enc["pixel_values"].shape[0] == t * h * w
        if expected is None:  # 400x300 is scaled down under max_pixels (16 tokens), keeping its aspect
            assert 4 < n_pad <= 16 and w > h
        else:
            assert n_pad == expected
    if type(proc).__qualname__.endswith("ImageOnly"):  # no torchvision here: videos are refused, by name
        from captionrl.errors import DataError

        with pytest.raises(DataError, match="videos"):
            proc(text=[text], videos=[[Image.new("RGB", (64, 64))] * 2], return_tensors="pt")
    # different pixels reach the language model
    enc = proc(text=[text, text], images=[[Image.new("RGB", (64, 64), (255, 0, 0))],
                                          [Image.new("RGB", (64, 64), (0, 0, 255))]], return_tensors="pt")
    with torch.no_grad():
        logits = backend.model(**enc).logits[:, -1]
    assert not torch.allclose(logits[0], logits[1])


@pytest.mark.slow
@pytest.mark.gpu_pins
def test_model_generate_and_backend_generate_with_images(tiny):
    import torch

    from captionrl.backends.base import ChatRequest
    from captionrl.domains.scenes import make_scene

    _family, backend = tiny
    proc, model = backend._processor, backend.model
    red = make_scene(0).render()
    enc = proc(text=[backend.render_chat(_msgs(None))], images=[red], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=6, do_sample=True, temperature=1.0)
    assert out.shape[1] == enc["input_ids"].shape[1] + 6 or proc.tokenizer.eos_token_id in out[0].tolist()

    text_only = [{"role": "user", "content": "Name a colour."}]
    reqs = [ChatRequest(_msgs(red), max_new_tokens=8, temperature=1.0, seed=1),
            ChatRequest(_msgs(make_scene(5).render()), max_new_tokens=8, temperature=1.0, seed=1),
            ChatRequest(text_only, max_new_tokens=8, temperature=1.0, seed=1)]
    got = backend.generate(reqs)
    assert all(g.error is None and g.text is not None for g in got), got
    assert any(g.text for g in got)  # a random model still writes tokens
    assert backend.generate([reqs[1]])[0].error is None


@pytest.mark.slow
@pytest.mark.gpu_pins
def test_choose_with_a_shared_prefix_matches_plain_batches(tiny):
    """The KV-cache prefix sharing of ``choose`` (multimodal rotary positions here) changes no probability."""
    from captionrl.backends.hf import HFBackend

    _family, backend = tiny
    stem = "Series A: " + ", ".join(str(i) for i in range(30)) + ". Which series is it? Answer with a letter. "
    prompts = [[{"role": "user", "content": stem + tail}] for tail in ("One.", "Two, longer.", "Three")]
    shared = backend.choose(prompts, ["A", "B"])
    plain = HFBackend.from_model(backend.model, backend._processor, share_prefix=False).choose(prompts, ["A", "B"])
    assert all(r.error is None for r in shared + plain)
    for a, b in zip(shared, plain, strict=True):
        assert a.probs["A"] == pytest.approx(b.probs["A"], abs=1e-4)
    assert len({round(r.probs["A"], 6) for r in shared}) > 1  # the differing suffixes were scored


@pytest.fixture
def vision_calls(monkeypatch):
    """Counts image-grid rows through the vision towers, so a test sees that pixels reached the policy."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as q25
    from transformers.models.qwen3_vl import modeling_qwen3_vl as q3

    calls: list[int] = []
    for cls in (q25.Qwen2_5_VisionTransformerPretrainedModel, q3.Qwen3VLVisionModel):
        original = cls.forward

        def forward(self, hidden_states, grid_thw, *a, _original=original, **kw):
            calls.append(int(grid_thw.shape[0]))
            return _original(self, hidden_states, grid_thw, *a, **kw)

        monkeypatch.setattr(cls, "forward", forward)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_rubicap_grpo_step_with_tiny_qwen_vl_policy(family, tmp_path, embedded_backend, vision_calls):
    from transformers import AutoProcessor

    from captionrl.backends.hf import resolve_model_path
    from captionrl.tiny_models.qwen_vl import CHAT_TEMPLATES
    from captionrl.train import rubicap
    from captionrl.train.rubicap import RubicapConfig
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples
    from checks import unchanged_between_folders

    out = tmp_path / "run"
    cfg = load_config(RubicapConfig, ROOT / "configs" / "rubicap-cpu.yaml", [
        f"policy.model=tiny-{family}", "data.items=scenes:2:0", "train.num_generations=2",
        "train.per_device_train_batch_size=2", "train.max_completion_length=8", "train.max_steps=1",
        "train.save_steps=1", "train.report_to=[]", "train.threads=1", "train.learning_rate=1.0e-3",
        f"train.out_dir={out}",
    ])
    result = rubicap.run(cfg, judge_backend=embedded_backend)
    metrics = load_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1] and metrics[0]["rubric/unscored_frac"] == 0.0
    samples = load_samples(out)
    assert len(samples) == 2 and vision_calls  # the image of each prompt went through the tower
    rewards = [s["reward"] for s in samples]  # the judge's likelihood-mode rewards: real and graded
    assert all(isinstance(r, float) and 0.0 <= r <= 1.0 for r in rewards) and rewards[0] != rewards[1], samples
    assert metrics[0]["reward"] == pytest.approx(sum(rewards) / 2, abs=1e-5)
    # as TRL's trainer tests check: every trainable parameter (vision tower, merger, language model) moved
    unchanged = unchanged_between_folders(resolve_model_path(f"tiny-{family}")[0], result["model"], vlm=True)
    assert not unchanged, f"parameters that did not move: {unchanged[:5]}"
    # the saved model reloads with its family's processor (what `captionrl caption` on a checkpoint needs)
    saved = AutoProcessor.from_pretrained(result["model"])
    assert type(saved).__name__ == {"qwen2.5-vl": "Qwen2_5_VLProcessor", "qwen3-vl": "Qwen3VLProcessor"}[family]
    assert saved.chat_template == CHAT_TEMPLATES[family]


@pytest.mark.slow
def test_lineup_rloo_step_with_tiny_qwen2_5_vl_policy_on_charts(tmp_path, embedded_backend, vision_calls):
    from captionrl.backends.hf import resolve_model_path
    from captionrl.train import lineup
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples
    from checks import unchanged_between_folders

    out = tmp_path / "run"
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", [
        "policy.model=tiny-qwen2.5-vl", "policy.input=chart", "warm_start.epochs=0", "train.freeze_layers=0",
        "data.window=8", "data.n_train=2", "data.n_test=2", "data.series=[nile,sunspots]",
        "reward.k=2", "reward.signal=soft", "train.algorithm=rloo", "train.num_generations=2",
        "train.per_device_train_batch_size=2", "train.max_completion_length=8", "train.max_steps=1",
        "train.save_steps=1", "train.learning_rate=1.0e-5", "train.beta=0.0", "train.report_to=[]",
        "train.threads=1", "eval.enabled=false", f"train.out_dir={out}",
    ])
    result = lineup.run(cfg, verifier=embedded_backend)
    metrics = load_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1] and metrics[0]["identification/unscored_frac"] == 0.0
    rewards = [s["reward"] for s in load_samples(out)]  # soft identification minus the config's penalties
    assert len(rewards) == 2 and all(isinstance(r, float) and r == r for r in rewards), rewards  # no None/NaN
    assert rewards[0] != rewards[1] and metrics[0]["reward"] == pytest.approx(sum(rewards) / 2, abs=1e-5)
    assert sum(vision_calls) >= 2  # the charts (not only numbers) reached the policy's vision tower
    unchanged = unchanged_between_folders(resolve_model_path("tiny-qwen2.5-vl")[0], result["model"], vlm=True)
    assert not unchanged, f"parameters that did not move: {unchanged[:5]}"


@pytest.mark.long  # the preset end to end: test_rehearsal_lineup.py in the default tier
@pytest.mark.slow
def test_lineup_paper_config_dry_run_with_tiny_qwen2_5_vl(tmp_path, embedded_backend, vision_calls):
    """configs/lineup-paper.yaml as a user dry-runs it: models, data, sizes and CPU switches replaced.

    Kept from the paper config: chart input (600x300 charts), RLOO with the authors' KL weight 0, gradient
    checkpointing, letter-mode verifier (K=2 here, the paper's 4 costs twice the verifier time), checkpoint selection on validation items and the
    held-out identification evaluation of the trained and the initial captioner.
    """
    from captionrl.train import lineup
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.run.curves import load_metrics

    out = tmp_path / "run"
    cfg = load_config(LineupConfig, ROOT / "configs" / "lineup-paper.yaml", [
        "policy.model=tiny-qwen2.5-vl", "policy.dtype=float32", "verifier.kind=hf", "verifier.model=embedded",
        "eval.verifiers={}",  # the paper's held-out verifiers are served models; the training one stays
        "data.prepared=null", "data.corpus=embedded",  # no prepared benchmark folder: the embedded corpus
        "data.window=8", "data.n_train=4", "data.n_val=2", "data.n_test=2", "reward.k=2",
        "train.num_generations=2", "train.per_device_train_batch_size=2", "train.max_completion_length=8",
        "train.max_steps=2", "train.save_steps=1", "train.report_to=[]", "train.threads=1",
        *ON_CPU, f"train.out_dir={out}",
        "train.force_preflight=true",  # the embedded verifier cannot tell honest from probes in letter mode
    ])
    assert (cfg.policy.input, cfg.reward.mode, cfg.train.beta, cfg.train.gradient_checkpointing, cfg.data.chart_size) == (
        "chart", "letter", 0.0, True, [600, 300])
    result = lineup.run(cfg, verifier=embedded_backend)
    assert "FAILED, forced" in (out / "preflight.md").read_text()  # the preflight ran, saw the weak verifier
    metrics = load_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["identification/unscored_frac"] == 0.0  # the verifier scored every caption
    assert set(result["selection"]["scores"]) == {"checkpoint-1", "checkpoint-2"}
    rows = {r["system"]: r for r in result["eval"]["rows"]}
    assert {"trained", "initial"} <= set(rows) and rows["trained"]["mode"] == "letter"
    assert sum(vision_calls) >= 8  # training, selection and evaluation all captioned charts


@pytest.mark.long  # the preset end to end: test_rehearsal_rubicap.py in the default tier
@pytest.mark.slow
@pytest.mark.server
@requires_llama_cpp
def test_rubicap_paper_config_dry_run_with_tiny_qwen2_5_vl(tmp_path, llama_server, vision_calls):
    """configs/rubicap-paper.yaml with its models, data and rubric source replaced by offline ones.

    Kept from the paper config: GRPO with the standard loss and beta 0.04 (a reference model), warmup,
    gradient checkpointing, and the judge's generate mode with hard yes/no decisions from a served
    OpenAI-compatible judge (here llama.cpp serving SmolLM2, asked for the judgment schema as
    ``json_object``: unconstrained, a 135M model rarely writes the JSON, and every reward would be None).
    """
    from captionrl.train import rubicap
    from captionrl.train.rubicap import RubicapConfig
    from captionrl.train.run.curves import load_metrics
    from captionrl.train.run.logging import load_samples

    out = tmp_path / "run"
    cfg = load_config(RubicapConfig, ROOT / "configs" / "rubicap-paper.yaml", [
        "policy.model=tiny-qwen2.5-vl", "policy.dtype=float32", f"judge.base_url={llama_server.base_url}",
        f"judge.model={llama_server.model}", "judge.concurrency=1", "reward.rubric.structured_output=json_object",
        "data.items=scenes:2:0", "rubrics.source=facts", "reward.rubric.max_new_tokens=96",
        "train.num_generations=2", "train.per_device_train_batch_size=2", "train.gradient_accumulation_steps=1",
        "train.max_completion_length=8", "train.max_steps=1", "train.save_steps=1", "train.report_to=[]",
        "train.threads=1", *ON_CPU, f"train.out_dir={out}",
        "train.force_preflight=true",  # a 135M judge's yes/no cannot tell the facts from the probes
    ])
    assert (cfg.reward.rubric.mode, cfg.reward.rubric.decision, cfg.train.loss_type, cfg.train.beta,
            cfg.train.gradient_checkpointing) == ("generate", "hard", "grpo", 0.04, True)
    rubicap.run(cfg)
    assert (out / "preflight.md").read_text().startswith("# Reward preflight")  # it ran before step 1
    metrics = load_metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1] and "kl" in metrics[0]
    assert metrics[0]["rubric/unscored_frac"] == 0.0, metrics[0]  # every schema-constrained reply parsed
    samples = load_samples(out)
    assert len(samples) == 2 and vision_calls
    for s in samples:  # a real hard-decision reward: the weighted share of the criteria judged satisfied
        assert s["error"] is None and s["method"] == "generate" and len(s["satisfied"]) == s["rubric_size"] > 0, s
        met = sum(w for w, yes in zip(s["weights"], s["satisfied"], strict=True) if yes)
        assert s["reward"] == pytest.approx(met / sum(s["weights"])), s
    assert metrics[0]["reward"] == pytest.approx(sum(s["reward"] for s in samples) / 2, abs=1e-5)


@pytest.mark.slow
@pytest.mark.gpu_pins
def test_moco_grpo_steps_with_tiny_qwen2_5_vl_policy(tmp_path, vision_calls):
    """MoCo Rubric's CPU config with the tiny Qwen2.5-VL policy: the policy's momentum copy (a second LoRA
    adapter) writes rubrics and judges (the config's mode). The random Generator writes no valid rubric, so every
    group falls back to fact rubrics, counted."""
    from captionrl.train import moco
    from captionrl.train.run.curves import load_metrics

    out = tmp_path / "run"
    cfg = load_config(moco.CONFIG, ROOT / "configs" / "moco-cpu.yaml", [
        "policy.model=tiny-qwen2.5-vl", "data.n_train=2", "train.num_generations=2",
        "train.per_device_train_batch_size=2", "train.max_completion_length=8", "rubric.max_new_tokens=16",
        "train.max_steps=2", "train.save_steps=2", "train.threads=1", f"train.out_dir={out}",
        "train.force_preflight=true",  # a random-weight momentum Judge cannot tell the facts from the probes
    ])
    moco.run(cfg)
    assert (out / "preflight.md").read_text().startswith("# Reward preflight")  # it ran before step 1
    metrics = [m for m in load_metrics(out / "metrics.jsonl") if "reward" in m]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["rubric/fallback_frac"] == 1.0 and m["rubric/generator_valid_frac"] == 0.0 for m in metrics)
    assert vision_calls
    # GRPO moved the policy (the groups' rewards differed) and the EMA trails it: after the first update the
    # momentum is m*phi0 + (1-m)*theta1, so it moved (1-m) as far as the policy and sits m as far from it
    m, first = cfg.momentum.m, metrics[0]
    assert first["frac_reward_zero_std"] < 1.0, first  # else nothing moves and the checks below are void
    assert first["momentum/policy_to_initial_l2"] > 0
    assert first["momentum/momentum_to_initial_l2"] == pytest.approx((1 - m) * first["momentum/policy_to_initial_l2"], abs=2e-6)
    assert first["momentum/distance"] == pytest.approx(m * first["momentum/policy_to_initial"], abs=2e-6)
    assert all(0 < x["momentum/momentum_to_initial"] < x["momentum/policy_to_initial"] for x in metrics)

"""``train.run.bottom_cache``: a frozen bottom computed once per row trains the same model as one computed every
epoch; calls it cannot key run the plain model; nothing of it is left on the model afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from captionrl.config import load_config
from captionrl.train.run.bottom_cache import cached_frozen_bottom
from captionrl.train.run.freezing import frozen_bottom, transformer_blocks

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "configs" / "lineup-cpu.yaml"


def _model(path: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _batches(n_rows: int = 6, epochs: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Right-padded batches of rows of different lengths, regrouped every epoch (as a shuffling sampler does)."""
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(5, 200, (int(n),), generator=g) for n in torch.randint(6, 14, (n_rows,), generator=g)]
    out = []
    for _ in range(epochs):
        order = torch.randperm(n_rows, generator=g).tolist()
        for i in range(0, n_rows, 3):
            group = [rows[j] for j in order[i:i + 3]]
            width = max(len(r) for r in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros(len(group), width, dtype=torch.long)
            for k, r in enumerate(group):
                ids[k, :len(r)], mask[k, :len(r)] = r, 1
            out.append((ids, mask))
    return out


def _train(model: torch.nn.Module, batches, cache: bool) -> dict:
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    with cached_frozen_bottom(model, 1 if cache else 0) as stats:
        for ids, mask in batches:
            labels = ids.masked_fill(mask == 0, -100)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        return {"served": stats.served_batches, "computed": stats.computed_batches, "stored": stats.stored} if stats else {}


def test_a_cached_bottom_trains_the_same_weights_as_a_computed_one(tiny_llama):
    batches = _batches()
    plain, cached = _model(tiny_llama), _model(tiny_llama)
    with frozen_bottom(plain, 1):
        _train(plain, batches, cache=False)
    with frozen_bottom(cached, 1):
        stats = _train(cached, batches, cache=True)
    # the first epoch computes (and stores) every row; the later two are served from the store
    assert stats == {"computed": 2, "served": 4, "stored": 6}
    moved = 0
    for (name, a), b in zip(plain.named_parameters(), cached.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
        moved += int(not torch.equal(a, _model(tiny_llama).state_dict()[name]))
    assert moved > 0  # the top trained (so equal weights are not two untouched models)


def test_the_store_is_used_only_when_it_computes_the_same_function(tiny_llama):
    """A bottom that takes gradients, left padding or embeddings given directly: the plain model runs."""
    model = _model(tiny_llama)
    ids = torch.tensor([[0, 0, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    with frozen_bottom(model, 1), cached_frozen_bottom(model, 1) as stats, torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits  # left padding: not keyed
        embeds = model.get_input_embeddings()(ids[:, 2:])
        model(inputs_embeds=embeds)
        assert stats.bypassed_calls == 2 and stats.stored == 0
    torch.testing.assert_close(got, want)
    with cached_frozen_bottom(model, 1) as stats, torch.no_grad():  # nothing frozen: the bottom takes gradients
        model(input_ids=ids[:, 2:])
        model(input_ids=ids[:, 2:])
        assert stats.bypassed_calls == 2 and stats.served_batches == 0


def test_nothing_of_the_cache_stays_on_the_model(tiny_llama):
    model = _model(tiny_llama)
    blocks = transformer_blocks(model)
    with frozen_bottom(model, 1), cached_frozen_bottom(model, 1):
        assert "forward" in vars(blocks[0])
    assert all("forward" not in vars(b) for b in blocks)
    assert not blocks[0]._forward_hooks and not model.model._forward_pre_hooks


@pytest.mark.slow
def test_the_warm_start_with_the_store_gives_the_warm_start_without_it(tmp_path, tiny_llama):
    """Through TRL's SFTTrainer (its fused LM head calls the backbone with the ids): three epochs of the CPU
    config's warm start on a tiny policy, ``warm_start.reuse_frozen`` on and off, end on the same weights."""
    from captionrl.domains.lineup_data import build_lineup_data
    from captionrl.train.lineup import LineupConfig
    from captionrl.train.run.loading import load_policy
    from captionrl.train.warm_start import warm_start

    weights = {}
    for reuse in (True, False):
        cfg = load_config(LineupConfig, CPU, ["data.n_train=6", "data.n_test=2", "warm_start.epochs=3",
                                              "warm_start.batch_size=3", "warm_start.freeze_layers=1",
                                              f"warm_start.reuse_frozen={str(reuse).lower()}",
                                              "warm_start.learning_rate=1.0e-2", f"policy.model={tiny_llama}",
                                              f"train.out_dir={tmp_path / str(reuse)}"])
        rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
        model, processing, _ = load_policy(cfg.policy)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        torch.manual_seed(0)
        summary = warm_start(cfg, rows, model, processing, tmp_path / str(reuse))
        if reuse:  # epoch 1 computes the 6 windows in 2 batches; epochs 2 and 3 are served from the store
            cache = summary["frozen_bottom_cache"]
            assert (cache["stored"], cache["computed_batches"], cache["served_batches"]) == (6, 2, 4), cache
        else:
            assert summary["frozen_bottom_cache"] is None
        weights[reuse] = model.state_dict()
        assert any(not torch.equal(before[k], v) for k, v in weights[reuse].items())
    for name, value in weights[False].items():
        torch.testing.assert_close(weights[True][name], value, rtol=1e-4, atol=1e-5, msg=name)

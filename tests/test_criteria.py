"""Every criterion behind one interface: planted useless heads rank last, exact reference values, l0 sparsity."""

from __future__ import annotations

import re
from functools import cache

import pytest
import torch
import torch.nn.functional as F

from compressor.pruning import criteria
from compressor.pruning.criteria.attribution import attribution
from compressor.pruning.criteria.confidence import special_positions
from compressor.pruning.masking import AttentionRecorder, gated
from compressor.surgery.arch import original_num_heads, presence_mask
from compressor.surgery.slicing import pruned_copy
from compressor.testing import ARCHS, VOCAB, tiny_batch, tiny_model

LAYERS, HEADS, SIZE = 3, 4, 8
USELESS = [(0, 1), (1, 2), (2, 0)]  # heads whose W_O slice is zeroed: provably no effect on the output
CLS, SEP = 2, 3
POSITIVE, NEGATIVE = list(range(4, 14)), list(range(14, 24))


def synthetic_batches(n: int, batch: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """[CLS] filler … one sentiment token … [SEP] (+ padding); the label says which sentiment set it came from."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, n, batch):
        size = min(batch, n - start)
        seq = 12
        ids = torch.randint(24, VOCAB, (size, seq), generator=g)
        labels = torch.randint(0, 2, (size,), generator=g)
        lengths = torch.randint(6, seq + 1, (size,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        for i in range(size):
            pool = POSITIVE if labels[i] else NEGATIVE
            ids[i, int(torch.randint(1, int(lengths[i]) - 1, (1,), generator=g))] = pool[
                int(torch.randint(0, len(pool), (1,), generator=g))
            ]
            ids[i, 0], ids[i, int(lengths[i]) - 1] = CLS, SEP
        ids = ids.masked_fill(mask == 0, 0)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def zero_out_proj(model: torch.nn.Module, heads: list[tuple[int, int]]) -> None:
    with torch.no_grad():
        for layer, head in heads:
            model.bert.encoder.layer[layer].attention.output.dense.weight[:, head * SIZE : (head + 1) * SIZE] = 0


@cache
def planted() -> torch.nn.Module:
    """A tiny BERT trained on the synthetic task with USELESS heads' W_O slices at 0 (gated off while training,
    so those slices get no gradient and stay exactly 0)."""
    model = tiny_model("bert", seed=1, layers=LAYERS, heads=HEADS, head_size=SIZE, randomized=False)
    zero_out_proj(model, USELESS)
    gates = torch.ones(LAYERS, HEADS)
    for layer, head in USELESS:
        gates[layer, head] = 0.0
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    data = synthetic_batches(256, 32, seed=0)
    with torch.enable_grad(), gated(model, gates):
        for _ in range(4):
            for batch in data:
                loss = F.cross_entropy(
                    model(**{k: v for k, v in batch.items() if k != "labels"}).logits, batch["labels"]
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
    model.eval()
    model.zero_grad(set_to_none=True)
    for layer, head in USELESS:
        weight = model.bert.encoder.layer[layer].attention.output.dense.weight
        assert weight[:, head * SIZE : (head + 1) * SIZE].abs().max() == 0
    return model


def context(model: torch.nn.Module, alive: torch.Tensor | None = None, n: int = 64, **kw) -> criteria.ScoreContext:
    alive = presence_mask(model) if alive is None else alive
    return criteria.ScoreContext(model=model, alive=alive, batches=synthetic_batches(n, 16, seed=7), **kw)


def test_planted_model_learned_the_task() -> None:
    """The planted model must be competent, or 'ranks useless heads last' would be a test of noise."""
    batches = synthetic_batches(128, 32, seed=3)
    with torch.no_grad():
        correct = sum(
            int(
                (
                    planted()(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1)
                    == b["labels"]
                ).sum()
            )
            for b in batches
        )
    assert correct / 128 > 0.75, correct


PLANTED_CASES = {
    "taylor": {},
    "taylor-label-free": {"label_free": True},
    "attribution": {"steps": 8, "examples": 32},
    "ablation": {},
    "l0": {"steps": 150},
}


@pytest.mark.parametrize("case", sorted(PLANTED_CASES))
def test_data_driven_criteria_rank_useless_heads_last(case: str) -> None:
    """Every data-driven criterion (not confidence/entropy, which only read attention maps) puts the heads that
    provably do nothing below every useful head, also with another head already masked."""
    name = case.split("-")[0]
    model = planted()
    alive = torch.ones(LAYERS, HEADS, dtype=torch.bool)
    alive[1, 0] = False  # a masked (present) head: gated off while scoring, reported as -inf
    ctx = context(model, alive, target_remove=len(USELESS), seed=0)
    scores = criteria.score_heads(name, ctx, PLANTED_CASES[case])
    useless = torch.zeros(LAYERS, HEADS, dtype=torch.bool)
    for layer, head in USELESS:
        useless[layer, head] = True
    assert scores[1, 0] == float("-inf")
    useful = alive & ~useless
    assert scores[useless].max() < scores[useful].min(), scores


@pytest.mark.parametrize("remove", [2, 5, 8])
def test_l0_target_mode_reaches_requested_sparsity(remove: int) -> None:
    """Deterministic open gates land within one head of alive − target_remove, and ranking by log α removes
    exactly the closed ones."""
    model = planted()
    ctx = context(model, target_remove=remove, seed=1)
    scores = criteria.score_heads("l0", ctx, {})  # the defaults
    info = ctx.extras["l0"]
    assert info["target_open"] == LAYERS * HEADS - remove
    assert abs(info["open_by_rank"] - info["target_open"]) <= 1, info
    assert abs(info["open"] - info["target_open"]) <= 1, info  # Voita's deterministic gates, not only E[L0]
    assert torch.isfinite(scores).all()


def test_l0_fixed_mode_prunes_more_with_larger_lambda() -> None:
    opened = []
    for lam in (0.0, 0.5):
        ctx = context(planted(), seed=0)
        criteria.score_heads("l0", ctx, {"mode": "fixed", "lam": lam, "steps": 100})
        opened.append(ctx.extras["l0"]["open"])
    assert opened[0] == LAYERS * HEADS and opened[1] < opened[0]


def test_l0_leaves_the_model_untouched() -> None:
    model = planted()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    criteria.score_heads("l0", context(model, target_remove=3), {"steps": 5})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and all(p.requires_grad for p in model.parameters())


def reference_attention(model: torch.nn.Module, batch: dict, gates: torch.Tensor) -> list[torch.Tensor]:
    """Attention probabilities through transformers' own `output_attentions` (independent of our recorder)."""
    with torch.no_grad(), gated(model, gates):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=True)
    return [a.float() for a in out.attentions]


@pytest.mark.parametrize(
    ("params", "drop_q", "drop_k"),
    [
        ({"exclude_special": False}, False, False),
        ({"special_as": "keys"}, False, True),
        ({"special_as": "queries"}, True, False),
        ({"special_as": "both"}, True, True),
    ],
)
def test_confidence_matches_reference(params: dict, drop_q: bool, drop_k: bool) -> None:
    model = planted()
    alive = torch.ones(LAYERS, HEADS, dtype=torch.bool)
    alive[0, 3] = False
    ctx = context(model, alive, n=32)
    scores = criteria.score_heads("confidence", ctx, params)
    total, count = torch.zeros(LAYERS, HEADS), 0
    for batch in ctx.batches:
        valid = batch["attention_mask"].bool()
        special = (batch["input_ids"] == CLS) | (batch["input_ids"] == SEP)
        q = valid & ~special if drop_q else valid
        k = valid & ~special if drop_k else valid
        for layer, att in enumerate(reference_attention(model, batch, ctx.gates())):
            peak = (att * k[:, None, None, :]).amax(-1)
            total[layer] += (peak * q[:, None, :]).sum((0, 2))
        count += int(q.sum())
    expected = (total / count).masked_fill(~alive, float("-inf"))
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)


def test_entropy_matches_reference() -> None:
    model = planted()
    ctx = context(model, n=32)
    total, count = torch.zeros(LAYERS, HEADS), 0
    for batch in ctx.batches:
        valid = batch["attention_mask"].bool()
        for layer, att in enumerate(reference_attention(model, batch, ctx.gates())):
            ent = -(att * att.clamp_min(1e-30).log() * valid[:, None, None, :]).sum(-1)
            total[layer] += (ent * valid[:, None, :]).sum((0, 2))
        count += int(valid.sum())
    torch.testing.assert_close(criteria.score_heads("entropy", ctx), -total / count, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(criteria.score_heads("entropy", ctx, {"keep": "high"}), total / count)


def test_special_positions_inferred_and_explicit() -> None:
    ids = torch.tensor([[2, 9, 3, 8, 3, 0], [2, 7, 3, 0, 0, 0]])
    mask = (ids != 0).long()
    expected = torch.tensor([[1, 0, 1, 0, 1, 0], [1, 0, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(special_positions(ids, mask), expected)
    assert torch.equal(special_positions(ids, mask, [2]), ids == 2)


def naive_attribution(model: torch.nn.Module, batch: dict, steps: int) -> torch.Tensor:
    """Hao et al. straight from the formula: one example, one α and one full forward/backward at a time."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    scores = torch.zeros(LAYERS, HEADS)
    for i in range(inputs["input_ids"].shape[0]):
        one = {k: v[i : i + 1, : int(batch["attention_mask"][i].sum())] for k, v in inputs.items()}
        with torch.no_grad():
            pred = int(model(**one).logits.argmax(-1))
        for layer in range(LAYERS):
            grad_sum, base = 0.0, None
            for k in range(1, steps + 1):
                rec = AttentionRecorder(scale={layer: k / steps}, retain_grad=True)
                with rec.attach(model):
                    prob = model(**one).logits.softmax(-1)[0, pred]
                (g,) = torch.autograd.grad(prob, rec.probs[layer])
                grad_sum = grad_sum + g / (k / steps)
                base = rec.probs[layer].detach()
            scores[layer] += (base * grad_sum / steps)[0].amax((-2, -1))
    return scores / inputs["input_ids"].shape[0]


def test_attribution_matches_naive_formula() -> None:
    """Batched α steps + skipped lower layers == the one-pass-per-α formula."""
    model = planted()
    ctx = context(model, n=6)
    got = attribution(ctx, steps=5, batch_size=4)
    expected = sum(naive_attribution(model, b, 5) * b["input_ids"].shape[0] for b in ctx.batches) / 6
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-4)


def test_magnitude_same_on_pruned_model_and_zero_head_last() -> None:
    model = tiny_model("bert", layers=LAYERS, heads=HEADS, head_size=SIZE)
    plan = {0: [1, 3], 1: [0, 1, 2, 3]}
    small = pruned_copy(model, plan)
    full = criteria.score_heads("magnitude", context(model))
    cut = criteria.score_heads("magnitude", context(small))
    keep = presence_mask(small)
    torch.testing.assert_close(cut[keep], full[keep])
    assert (cut[~keep] == float("-inf")).all()
    with torch.no_grad():
        attn = model.bert.encoder.layer[2].attention
        for lin in (attn.self.query, attn.self.key, attn.self.value):
            lin.weight[SIZE : 2 * SIZE] = 0
            lin.bias[SIZE : 2 * SIZE] = 0
        attn.output.dense.weight[:, SIZE : 2 * SIZE] = 0
    scores = criteria.score_heads("magnitude", context(model))
    assert scores[2, 1] == 0 and (scores.flatten().argsort()[0] == 2 * HEADS + 1)


def test_random_is_seeded() -> None:
    model = tiny_model("bert", layers=LAYERS, heads=HEADS, head_size=SIZE)
    a, b, c = (criteria.score_heads("random", context(model, seed=s)) for s in (3, 3, 4))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("confidence", {}),
        ("entropy", {}),
        ("attribution", {"steps": 3, "examples": 3}),
        ("ablation", {"examples": 3}),
        ("l0", {"steps": 3}),
        ("magnitude", {}),
        ("random", {}),
        ("taylor", {}),
    ],
)
def test_every_criterion_on_every_arch_with_pruned_and_masked_heads(arch: str, name: str, params: dict) -> None:
    """Shape [layers, original heads], finite on alive heads, -inf on removed and masked ones, even with a layer
    that has lost every head."""
    model = pruned_copy(tiny_model(arch, layers=LAYERS, heads=HEADS, head_size=SIZE), {0: [1], 1: [0, 1, 2, 3]})
    alive = presence_mask(model)
    alive[2, 2] = False
    batch = tiny_batch(batch=3, seq=9)
    ctx = criteria.ScoreContext(model=model, alive=alive, batches=[batch], target_remove=2)
    scores = criteria.score_heads(name, ctx, params)
    assert scores.shape == (LAYERS, original_num_heads(model))
    assert torch.isfinite(scores[alive]).all()
    assert (scores[~alive] == float("-inf")).all()


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("confidence", {"special_as": "key"}, "params.special_as: expected one of ['keys', 'queries', 'both']"),
        ("attribution", {"step": 10}, "params.step: unknown parameter for 'attribution'"),
        ("attribution", {"target": "label"}, "params.target: expected one of ['predicted', 'gold']"),
        ("l0", {"mode": "lagrangian"}, "params.mode: expected one of ['target', 'fixed']"),
        ("l0", {"lam": "big"}, "params.lam: Input should be a valid number (got 'big')"),
        ("l0", {"lam": -0.1}, "params.lam: Input should be greater than or equal to 0 (got -0.1)"),
        ("l0", {"lr": 0.0}, "params.lr: Input should be greater than 0 (got 0.0)"),
        ("l0", {"steps": 2.5}, "params.steps: Input should be a valid integer (got 2.5)"),
        ("attribution", {"steps": 0}, "params.steps: Input should be greater than or equal to 1 (got 0)"),
        ("attribution", {"batch_size": True}, "params.batch_size: Input should be a valid integer (got True)"),
        ("ablation", {"examples": 0}, "params.examples: Input should be greater than or equal to 1 (got 0)"),
        ("taylor", {"normalize": "lyer"}, "params.normalize: expected one of ['layer', 'none'], got 'lyer'"),
        ("taylor", {"label_free": "yes"}, "params.label_free: Input should be a valid boolean (got 'yes')"),
        ("ablation", {"metric": "f1"}, "params.metric: expected one of ['loss', 'accuracy']"),
        ("entropy", {"keep": "mid"}, "params.keep: expected one of ['low', 'high']"),
        ("random", {"seed": 3}, "params.seed: unknown parameter for 'random'"),
        ("magnitude_", {}, "unknown criterion 'magnitude_'"),
    ],
)
def test_bad_names_and_params_fail_at_validate_time(name: str, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        criteria.check_params(name, params)


def test_bad_values_are_refused_before_scoring() -> None:
    """score_heads checks the parameters before the criterion runs (so nothing is computed with them)."""
    ctx = context(planted(), n=4)
    with pytest.raises(ValueError, match="params.steps: Input should be greater than or equal to 1"):
        criteria.score_heads("attribution", ctx, {"steps": 0})
    with pytest.raises(ValueError, match="params.lr: Input should be greater than 0"):
        criteria.score_heads("l0", ctx, {"lr": 0.0})

"""The latency table: synthetic pieces, interpolation, removed layers, marginal costs, cache and errors.

Timings on a shared machine are noisy, so measured numbers are only checked for structure (positive, finite, on the
right grid); everything numerical is checked on tables with known values.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from compressor.core.errors import UserError
from compressor.pruning.latency import Dims, LatencyTable, Widths, check_runtime, load_or_build
from compressor.pruning.latency.probe import SyntheticLayer, SyntheticOutside, grid_counts, runner
from compressor.pruning.latency.table import cache_file, cache_key, monotone_grid
from compressor.testing import int8_tolerance, tiny_config

DIMS = Dims(hidden=32, heads=4, head_size=8, intermediate=64, layers=3, vocab=120, positions=64, num_labels=2)
FAST = {"rounds": 1, "min_time_s": 0.0}


def bilinear(h: float, n: float) -> float:
    """A function bilinear interpolation must reproduce everywhere (it is bilinear itself)."""
    return 0.5 + 0.2 * h + 0.01 * n + 0.003 * h * n


def known_table(f=bilinear) -> LatencyTable:
    heads, neurons = [0, 1, 2, 4], [0, 16, 32, 48, 64]
    return LatencyTable(
        runtime="pytorch",
        batch_size=2,
        seq_len=8,
        threads=1,
        dims=DIMS,
        heads_grid=heads,
        neurons_grid=neurons,
        layer_grid_ms=[[f(h, n) for n in neurons] for h in heads],
        outside_ms=0.7,
    )


# ---------------------------------------------------------------------------------------------------- the table


def test_interpolation_exact_at_grid_points_and_bilinear_between():
    table = known_table(lambda h, n: float(np.sin(h) + np.cos(n / 10)))  # not bilinear: only the grid is exact
    for i, h in enumerate(table.heads_grid):
        for j, n in enumerate(table.neurons_grid):
            if (h, n) != (0, 0):
                assert table.layer_ms(h, n) == pytest.approx(table.layer_grid_ms[i][j], abs=1e-12)
    exact = known_table()
    for h, n in [(3, 40), (1, 1), (2, 63), (4, 7), (0, 5), (3, 0)]:
        assert exact.layer_ms(h, n) == pytest.approx(bilinear(h, n))


def test_a_layer_with_no_units_costs_nothing_and_is_removed_from_the_model():
    table = known_table()
    assert table.layer_grid_ms[0][0] > 0  # an emptied layer is measured, for interpolation near the corner
    assert table.layer_ms(0, 0) == 0.0
    assert table.model_ms([0, 0, 0], [0, 0, 0]) == pytest.approx(table.outside_ms)
    full = table.model_ms([4, 4, 4], [64, 64, 64])
    assert full == pytest.approx(0.7 + 3 * bilinear(4, 64))
    assert table.model_ms([4, 0, 4], [64, 0, 64]) == pytest.approx(full - bilinear(4, 64))


def test_speedup_is_the_ratio_of_predicted_model_times():
    table = known_table()
    pruned = Widths(heads=(2, 0, 1), neurons=(32, 0, 16))
    expected = table.model_ms([4] * 3, [64] * 3) / table.model_ms(pruned.heads, pruned.neurons)
    assert table.speedup(DIMS.full(), pruned) == pytest.approx(expected)
    assert table.speedup(([4] * 3, [64] * 3), ((2, 0, 1), (32, 0, 16))) == pytest.approx(expected)
    assert table.speedup(DIMS.full(), DIMS.full()) == pytest.approx(1.0)
    assert expected > 1


@pytest.mark.parametrize(("heads", "neurons", "unit", "count"), [(4, 64, "head", 1), (2, 40, "neurons", 16)])
def test_marginal_ms_is_the_model_time_saved(heads, neurons, unit, count):
    table = known_table()
    before = table.model_ms([heads, 4], [neurons, 64])
    after_heads, after_neurons = (heads - count, neurons) if unit == "head" else (heads, neurons - count)
    after = table.model_ms([after_heads, 4], [after_neurons, 64])
    assert table.marginal_ms(heads, neurons, unit, count) == pytest.approx(before - after)


def test_removing_a_layers_last_unit_saves_the_emptied_layer_too():
    table = known_table()
    assert table.marginal_ms(1, 0, "head") == pytest.approx(bilinear(1, 0))
    assert table.marginal_ms(0, 16, "neurons", 16) == pytest.approx(bilinear(0, 16))


def test_marginal_ms_refuses_impossible_removals():
    table = known_table()
    with pytest.raises(ValueError, match="cannot remove 2 head"):
        table.marginal_ms(1, 64, "head", 2)
    with pytest.raises(ValueError, match="unit must be"):
        table.marginal_ms(1, 64, "layer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="0..4 heads"):
        table.layer_ms(5, 0)


def test_monotone_grid_lowers_cells_to_the_cheapest_wider_cell():
    raw = [[1.0, 5.0, 4.0], [3.0, 2.0, 6.0], [2.5, 7.0, 8.0]]
    assert monotone_grid(raw) == [[1.0, 2.0, 4.0], [2.0, 2.0, 6.0], [2.5, 7.0, 8.0]]
    rising = [[1.0, 2.0], [3.0, 4.0]]
    assert monotone_grid(rising) == rising


def test_dict_round_trip_predicts_the_same():
    table = known_table()
    again = LatencyTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert again == table
    assert again.layer_ms(3, 40) == pytest.approx(table.layer_ms(3, 40))


# ---------------------------------------------------------------------------------------------------- shapes, errors


def test_dims_from_configs_of_different_naming():
    bert, distil = Dims.from_config(tiny_config("bert")), Dims.from_config(tiny_config("distilbert"))
    assert bert == Dims(
        hidden=32, heads=4, head_size=8, intermediate=67, layers=3, vocab=120, positions=64, num_labels=2
    )
    assert distil == bert  # DistilBERT's dim / n_heads / hidden_dim / n_layers read as the same sizes
    assert Widths(heads=(4,) * 3, neurons=(67,) * 3) == bert.full()


def test_grid_counts_include_both_ends():
    assert grid_counts(12, (0.25, 0.5)) == [0, 3, 6, 12]
    assert grid_counts(12, (0.25, 0.5), smallest=1) == [0, 1, 3, 6, 12]  # the narrowest non-empty width too
    assert grid_counts(20, (0.5,), smallest=32) == [0, 10, 20]  # a block wider than the layer: not measured
    with pytest.raises(UserError, match="latency.grid"):
        grid_counts(12, (1.5,))


def test_bad_runtime_is_a_one_line_error():
    with pytest.raises(UserError) as err:
        check_runtime("tensorrt")
    message = str(err.value)  # every declared budget runtime (`core.runtimes.BUDGET_NAMES`), then the bad value
    assert message.startswith("budget.runtime: expected one of pytorch, onnx-fp32, onnx-int8")
    assert message.endswith(", got 'tensorrt'") and "\n" not in message
    with pytest.raises(UserError, match="budget.runtime"):
        LatencyTable.build(DIMS, "onnx", batch_size=1, seq_len=8)


def test_too_long_sequences_are_refused():
    with pytest.raises(UserError, match=r"budget.seq_len: expected 1 to 64 tokens"):
        LatencyTable.build(DIMS, "pytorch", batch_size=1, seq_len=65)


@pytest.mark.parametrize(("heads", "neurons"), [(4, 64), (1, 0), (0, 16), (0, 0)])
def test_synthetic_layer_keeps_the_hidden_shape(heads, neurons):
    x = torch.randn(2, 5, DIMS.hidden)
    layer = SyntheticLayer(DIMS, heads, neurons)
    assert layer(x).shape == x.shape
    widths = sum(p.numel() for p in layer.parameters()) - 6 * DIMS.hidden  # two biases, two LayerNorms
    qkv_o = 4 * heads * DIMS.head_size * DIMS.hidden + 3 * heads * DIMS.head_size + (DIMS.hidden if heads else 0)
    ffn = 2 * neurons * DIMS.hidden + neurons + (DIMS.hidden if neurons else 0)
    assert widths == qkv_o + ffn


@pytest.mark.parametrize("runtime", ["onnx-fp32", "onnx-int8"])
def test_onnx_runners_compute_what_pytorch_computes(runtime, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 6, DIMS.hidden)
    layer = SyntheticLayer(DIMS, 2, 16).eval()
    with torch.no_grad():
        expected = layer(x).numpy()
    atol = int8_tolerance(layer, lambda: layer(x)) if runtime == "onnx-int8" else 1e-4
    got = runner(layer, x, runtime, threads=1, workdir=tmp_path)()[0]
    np.testing.assert_allclose(got, expected, atol=atol)
    ids = torch.randint(0, DIMS.vocab, (2, 6))
    outside = SyntheticOutside(DIMS).eval()
    with torch.no_grad():
        assert outside(ids).shape == (2, DIMS.num_labels)


# ---------------------------------------------------------------------------------------------------- measuring, cache


def test_build_measures_every_grid_cell():
    table = LatencyTable.build(tiny_config("bert"), "pytorch", 2, 8, threads=1, grid=(0.5,), **FAST)
    assert table.heads_grid == [0, 1, 2, 4] and table.neurons_grid == [0, 32, 34, 67]  # + one head, one block
    values = [v for row in table.layer_grid_ms for v in row] + [table.outside_ms]
    assert all(math.isfinite(v) and v > 0 for v in values)
    assert table.threads == 1 and table.key["threads"] == 1
    grid, raw = np.array(table.layer_grid_ms), np.array(table.measured_grid_ms)
    assert (np.diff(grid, axis=0) >= 0).all() and (np.diff(grid, axis=1) >= 0).all() and (grid <= raw).all()
    assert grid[-1, -1] == raw[-1, -1]
    assert table.key == cache_key(table.dims, "pytorch", 2, 8, 1, [0, 1, 2, 4], [0, 32, 34, 67])


def test_cache_round_trip_and_stale_key_rebuilds(tmp_path, monkeypatch):
    config, grid = tiny_config("bert"), (1.0,)
    first = load_or_build(config, "pytorch", 1, 8, threads=1, grid=grid, cache_dir=tmp_path, **FAST)
    path = cache_file(first.dims, "pytorch", 1, 8, tmp_path)
    assert path.is_file() and json.loads(path.read_text())["key"] == first.key

    def no_build(*args, **kwargs):
        raise AssertionError("a valid cached table must not be measured again")

    with monkeypatch.context() as m:
        m.setattr(LatencyTable, "build", no_build)
        assert load_or_build(config, "pytorch", 1, 8, threads=1, grid=grid, cache_dir=tmp_path) == first

    stale = json.loads(path.read_text())
    stale["key"]["cpu"] = "another machine"
    stale["outside_ms"] = -1.0
    path.write_text(json.dumps(stale))
    rebuilt = load_or_build(config, "pytorch", 1, 8, threads=1, grid=grid, cache_dir=tmp_path, **FAST)
    assert rebuilt.key == first.key and rebuilt.outside_ms > 0
    assert json.loads(path.read_text())["key"]["cpu"] != "another machine"

    path.write_text("{not json")
    assert load_or_build(config, "pytorch", 1, 8, threads=1, grid=grid, cache_dir=tmp_path, **FAST).outside_ms > 0


# ---------------------------------------------------------------------------------------------------- recipe schema


def budget_error(budget: dict) -> str:
    """The one-line message a recipe holding `budget` under `budget:` gets."""
    from pydantic import ValidationError

    from compressor.recipe import BudgetSpec, Strict, format_validation_error

    class Holder(Strict):
        budget: BudgetSpec

    with pytest.raises(ValidationError) as err:
        Holder.model_validate({"budget": budget})
    return format_validation_error(err.value)


def test_budget_spec_defaults_and_runtimes_match_the_latency_table():
    from typing import get_args

    from compressor.pruning.latency import BUDGET_RUNTIMES, RUNTIMES
    from compressor.recipe import BudgetSpec

    spec = BudgetSpec.model_validate({"kind": "speedup", "value": 2.0, "runtime": "onnx-int8"})
    assert (spec.batch_size, spec.seq_len, spec.runtime) == (32, 64, "onnx-int8")
    assert get_args(BudgetSpec.model_fields["runtime"].annotation) == BUDGET_RUNTIMES
    assert RUNTIMES == BUDGET_RUNTIMES  # the former name still imports
    assert BudgetSpec().kind == "heads" and BudgetSpec(kind="flops", value=0.6).value == 0.6


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"kind": "speedup", "value": 0.5}, "budget.value: for kind 'speedup' expected a speed-up factor above 1"),
        ({"kind": "flops", "value": 2.0}, "budget.value: for kind 'flops' expected a fraction removed between 0 and 1"),
        ({"kind": "heads", "value": float("nan")}, "budget.value: Input should be a finite number"),
        ({"kind": "speedup", "value": 2, "runtime": "onnx"}, "budget.runtime: Input should be 'pytorch'"),
        ({"kind": "latency", "value": 2}, "budget.kind: Input should be 'heads', 'flops' or 'speedup'"),
        ({"kind": "speedup", "value": 2, "seq_len": 4}, "budget.seq_len: Input should be greater than or equal to 8"),
        ({"kind": "speedup", "value": 2, "batch": 4}, "budget.batch: unknown key"),
    ],
)
def test_budget_spec_errors_name_the_field(budget, message):
    text = budget_error(budget)
    assert text.startswith(message) and "\n" not in text


def test_the_table_times_with_the_benchmarks_rotating_rounds():
    """`probe.measure` drives `core.timing.Rounds`: warm-up calls first, then every round visits every call once,
    one further along each round; the figure is the median over rounds of each round's fastest call."""
    from compressor.pruning.latency.probe import measure, timed_rounds

    log: list[str] = []
    calls = {name: (lambda name=name: log.append(name)) for name in "abc"}
    ms = measure(calls, rounds=3, min_time_s=0.0, warmup=1)
    assert log[:3] == ["a", "b", "c"]  # warm-up
    assert log[3:] == [name for order in ("abc", "bca", "cab") for name in order for _ in range(3)]  # 3 calls a visit
    assert set(ms) == set("abc") and all(v >= 0 for v in ms.values())
    log.clear()
    per_round = timed_rounds(calls, 3, 0.0, min_calls=1, warmup=0, groups=[["a", "b"], ["c"]])
    assert log == ["a", "b", "c", "b", "a", "c", "a", "b", "c"]  # each group rotated on its own, groups in order
    assert {k: len(v) for k, v in per_round.items()} == {"a": 3, "b": 3, "c": 3}


def test_the_tables_onnx_sessions_do_not_spin(tmp_path, monkeypatch):
    """A latency table times dozens of ONNX Runtime sessions in turn; each is made with its idle worker threads not
    spinning (spinning ones take the cores from the next block), where a session of the bench or a user spins."""
    from compressor.deploy import inference

    made = []

    class Recording(inference.OnnxClassifier):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.session.get_session_options().get_session_config_entry(inference.SPINNING))

    monkeypatch.setattr(inference, "OnnxClassifier", Recording)
    dims = Dims.from_config(tiny_config())
    call = runner(SyntheticLayer(dims, 2, 16), torch.randn(2, 8, dims.hidden), "onnx-int8", 1, tmp_path)
    call()
    assert made == ["0"]
    with pytest.raises(RuntimeError, match="allow_spinning"):  # a session made as the bench makes it sets nothing
        inference.cpu_session(next(tmp_path.rglob("*.onnx"))).get_session_options().get_session_config_entry(
            inference.SPINNING
        )

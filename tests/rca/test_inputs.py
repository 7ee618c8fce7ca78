"""The model's declared inputs: every feature vector's layout fits the shipped checkpoints, and
`Batch` carries the encoded arrays to the model and back to disk unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from teller.rca.infer import DEFAULT_MODEL, variant_dir
from teller.rca.inputs import LOG, QUEUE, STEP, TOKEN, Batch, Feature, Layout


@pytest.mark.skipif(
    not (DEFAULT_MODEL / "model.safetensors").is_file(), reason="no shipped default model"
)
@pytest.mark.parametrize("variant", ["model", "no-logs", "no-numeric", "raw-nodes"])
def test_the_layouts_are_as_wide_as_the_shipped_checkpoints_read(variant):
    weights = load_file(variant_dir(variant) / "model.safetensors")
    for layer, layout in (("step_in", STEP), ("token_in", TOKEN), ("log_in", LOG)):
        widths = {w.shape[1] for name, w in weights.items() if name.endswith(f"{layer}.weight")}
        assert widths == {layout.width}, (layer, widths)


def test_features_sit_where_the_checkpoints_learned_them():
    """A few anchors of the trained order (default_model/README.md lists every feature): moving
    one breaks the shipped checkpoints silently, so the order is pinned."""
    assert (STEP["z"], STEP["flagged"], STEP["shifted"], STEP["previous_z"]) == (0, 7, 14, 16)
    assert (STEP["run_flagged_share"], STEP["kernel_median"], STEP["context_vs_usual"]) == (
        24,
        32,
        36,
    )
    assert (STEP["transfer_ratio"], STEP["kernel_scatter"]) == (38, 42)
    assert STEP.indices(["gpu_imbalance", "host_over_time", "comm_over_time"]) == [8, 11, 13]
    assert LOG["fields"] == slice(0, 5) and LOG["severe"] == 5
    assert QUEUE["waiting"] == 0 and QUEUE["kv_cache_known"] == 5
    assert TOKEN["log_duration"] == 0 and TOKEN["candidate_order"] == 5


def test_a_layout_names_each_feature_once_and_positions_wide_ones_as_slices():
    layout = Layout((Feature("a", 1, "x"), Feature("b", 3, "y"), Feature("c", 1, "z")))
    assert layout.width == 5 and layout["b"] == slice(1, 4) and layout["c"] == 4
    with pytest.raises(ValueError, match="not all one-float"):
        layout.indices(["a", "b"])
    with pytest.raises(ValueError, match="declared twice"):
        Layout((Feature("a", 1, "x"), Feature("a", 1, "y")))


def test_a_batch_round_trips_through_its_arrays_and_drops_its_labels_for_inference():
    batch = Batch.blank(3)
    batch.step_float[1, STEP["z"]] = 0.5
    again = Batch.from_arrays(batch.arrays())
    assert all(np.array_equal(v, again.arrays()[k]) for k, v in batch.arrays().items())
    assert "y_mechanism" not in Batch.blank(3, labels=False).arrays()  # absent: not stored
    bare = batch.inputs()
    assert bare.y_step is None and bare.y_ptr is None and bare.y_mechanism is None
    assert len(bare) == 3
    picked = batch.rows(np.array([1]))
    assert len(picked) == 1 and picked.step_float[0, STEP["z"]] == 0.5

"""Issue 39 item 2: the head's two choices where vLLM's LiLiCorrHead computes otherwise, vLLM's by default.

`head.lilicorr_slot_bias`: one slot-distance / same-slot bias table shared by every lattice layer (vLLM) or one per
layer (ours before). `head.lilicorr_norm_eps`: the head's RMSNorms at the drafter's rms_norm_eps (vLLM) or 1e-6.
A two-layer shared head exports to vLLM's layout with no conversion and reads back proposing the same tokens;
per-layer checkpoints load into a shared head by the tables' mean (how v7 is continued), said in a warning; an
export made before the options existed loads as it was built.
"""

import json
import warnings

import pytest
import torch

from lilicorr.models.export import read_export, write_zlab, zlab_refusal
from lilicorr.models.heads.lattice_transformer import LatticeTransformer
from lilicorr.models.joint import JointModel

from test_models_export_lilicorr import STOPS, tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TWO_LAYERS = ["head.num_layers=2"]


def test_defaults_are_vllm_s_choices_and_build_what_they_say():
    m = tiny(TWO_LAYERS, perturb=False)
    h = m.head
    assert h.cfg.lilicorr_slot_bias == "shared" and h.cfg.lilicorr_norm_eps == "drafter"
    names = [n for n, _ in h.named_parameters() if "slot_distance" in n]
    assert names == ["lattice.bias.slot_distance"]  # one table for both layers
    eps = m.drafter.shape.rms_norm_eps
    assert eps != 1e-6
    assert all(n.eps == eps for n in (h.lattice.norm, h.target_norm, *(L.attn_norm for L in h.lattice.layers)))
    old = tiny([*TWO_LAYERS, "head.lilicorr_slot_bias=per_layer", "head.lilicorr_norm_eps=fixed"], perturb=False).head
    assert [n for n, _ in old.named_parameters() if "slot_distance" in n] == [
        "lattice.layers.0.bias.slot_distance", "lattice.layers.1.bias.slot_distance"]
    assert old.lattice.norm.eps == 1e-6 and old.target_norm.eps == 1e-6
    # the shared table is one parameter: 2 heads' fewer tables than per layer
    n_shared, n_old = (sum(p.numel() for p in x.parameters()) for x in (h, old))
    assert n_old - n_shared == h.cfg.num_heads * (2 * h.S - 1) + h.cfg.num_heads


def test_shared_table_is_read_by_every_layer():
    """The lattice with a shared table equals a per-layer lattice whose layers all hold that table (hand-built)."""
    torch.manual_seed(0)
    shared = LatticeTransformer(16, 2, 32, 2, 5, shared_bias=True)
    with torch.no_grad():
        for p in shared.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    per_layer = LatticeTransformer(16, 2, 32, 2, 5, shared_bias=False)
    state = shared.state_dict()
    for i in range(2):
        for n in ("slot_distance", "same_slot"):
            state[f"layers.{i}.bias.{n}"] = state[f"bias.{n}"]
    per_layer.load_state_dict({k: v for k, v in state.items() if not k.startswith("bias.")})
    x = torch.randn(3, 5, 4, 16)
    assert torch.equal(shared(x), per_layer(x))


def test_state_written_the_other_way_loads_exactly_or_by_mean_with_a_warning():
    torch.manual_seed(0)
    per_layer = LatticeTransformer(16, 2, 32, 2, 5, shared_bias=False)
    with torch.no_grad():
        for L in per_layer.layers:
            L.bias.slot_distance.normal_()
            L.bias.same_slot.normal_()
    shared = LatticeTransformer(16, 2, 32, 2, 5, shared_bias=True)
    with pytest.warns(UserWarning, match="by their mean: not the model as trained"):
        shared.load_state_dict(per_layer.state_dict())
    mean = (per_layer.layers[0].bias.slot_distance + per_layer.layers[1].bias.slot_distance) / 2
    assert torch.allclose(shared.bias.slot_distance, mean)
    back = LatticeTransformer(16, 2, 32, 2, 5, shared_bias=False)
    back.load_state_dict(shared.state_dict())  # shared -> per layer: copies, exact
    assert all(torch.equal(L.bias.slot_distance, shared.bias.slot_distance) for L in back.layers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # equal per-layer tables (vLLM's layout read back) load with no warning
        LatticeTransformer(16, 2, 32, 2, 5, shared_bias=True).load_state_dict(back.state_dict())


def test_a_two_layer_shared_head_serves_in_vllm_s_layout_as_trained(tmp_path):
    m = tiny(TWO_LAYERS)
    assert zlab_refusal(m.cfg) is None
    m.export(tmp_path / "e")
    z = tmp_path / "z"
    warns = write_zlab(read_export(tmp_path / "e"), z, m.target.hf.config, STOPS)
    assert not any("converted" in w or "rms_norm_eps" in w for w in warns)
    assert "converted" not in json.loads((z / "config.json").read_text())["lilicorr"]
    back = read_export(z)
    assert back.cfg.head.lilicorr_slot_bias == "shared" and back.cfg.head.lilicorr_norm_eps == "drafter"
    j = JointModel.load_exported(z, m.target.hf).eval()
    assert torch.equal(j.head.lattice.bias.slot_distance, m.head.lattice.bias.slot_distance)
    ids = torch.randint(4, 512, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        b = m.build_batch(ids, torch.ones_like(ids, dtype=torch.bool), anchors=torch.arange(1, 20)[None])
        ours = m.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids).tokens
        theirs = j.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids).tokens
    assert torch.equal(ours, theirs)


def test_an_export_made_before_the_options_loads_as_it_was_built(tmp_path):
    m = tiny([*TWO_LAYERS, "head.lilicorr_slot_bias=per_layer", "head.lilicorr_norm_eps=fixed"])
    m.export(tmp_path / "e")
    path = tmp_path / "e" / "config.json"
    raw = json.loads(path.read_text())
    for key in ("lilicorr_slot_bias", "lilicorr_norm_eps"):
        del raw["config"]["head"][key]  # as every export before issue 39 item 2 was written
    path.write_text(json.dumps(raw))
    ex = read_export(tmp_path / "e")
    assert ex.cfg.head.lilicorr_slot_bias == "per_layer" and ex.cfg.head.lilicorr_norm_eps == "fixed"
    j = JointModel.load_exported(tmp_path / "e", m.target.hf).eval()
    assert j.head.lattice.norm.eps == 1e-6
    assert torch.equal(j.head.lattice.layers[1].bias.slot_distance, m.head.lattice.layers[1].bias.slot_distance)



def test_continuing_a_per_layer_head_as_shared_says_so(tmp_path):
    """train.init_from of a v7-like head into the new defaults: the mean tables, and the change named in what loaded."""
    old = tiny([*TWO_LAYERS, "head.lilicorr_slot_bias=per_layer", "head.lilicorr_norm_eps=fixed"])
    old.export(tmp_path / "e")
    new = tiny(TWO_LAYERS, perturb=False)
    with pytest.warns(UserWarning, match="by their mean"):
        loaded = new.init_from_export(tmp_path / "e")
    assert loaded == ["drafter", "head continued with head.lilicorr_slot_bias=shared (trained per_layer), "
                                 "head.lilicorr_norm_eps=drafter (trained fixed)"]
    mean = sum(L.bias.slot_distance for L in old.head.lattice.layers) / 2
    assert torch.allclose(new.head.lattice.bias.slot_distance, mean)


def test_a_head_without_the_options_names_no_change(tmp_path):
    """A DFlash export from before the options (read as per_layer / fixed) continued under the new defaults: nothing
    of LiLiCorr's is said to change, since a vanilla head has none of it."""
    old = tiny(["head.kind=none", "head.lilicorr_slot_bias=per_layer", "head.lilicorr_norm_eps=fixed"])
    old.export(tmp_path / "e")
    assert tiny(["head.kind=none"], perturb=False).init_from_export(tmp_path / "e") == ["drafter", "head"]

"""models/export.py: one reader for every export, and the z-lab layout (what vLLM, SGLang and z-lab load).

Random tiny drafters for the refusals and the file format; the shipped SmolLM2 exports for the round trip
(their bf16 weights survive the z-lab layout bit for bit, so the re-imported drafter must propose exactly the
same tokens)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from lilicorr.config import load_config
from lilicorr.models.export import (MASK_EMBEDDING_FILE, ZLAB_HEAD_FILE, ZLAB_INDEX_FILE, ExportMissing, ZlabRefused,
                                    read_export, read_meta, write_zlab)
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target
from lilicorr.models.vocab_ranking import VOCAB_RANKING_FILE, write_vocab_ranking

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STOPS = [3]


def tiny(extra=()):
    cfg = load_config("tiny-random", ["target.vocab_size=512", *extra])
    torch.manual_seed(0)
    return JointModel(cfg, build_random_target(cfg.target))


def test_read_meta_tells_a_missing_export_and_a_foreign_zlab_folder(tmp_path):
    with pytest.raises(ExportMissing, match="no config.json"):
        read_meta(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"], "block_size": 16}))
    with pytest.raises(ValueError, match="drafter.checkpoint"):  # a public checkpoint: a drafter start, not an export
        read_meta(tmp_path)


def test_a_drafter_without_qk_norms_is_refused_with_the_reason(tmp_path):
    m = tiny(["drafter.qk_norm=false"])
    m.export(tmp_path / "e")
    with pytest.raises(ZlabRefused, match="drafter.qk_norm=false"):
        write_zlab(read_export(tmp_path / "e"), tmp_path / "z", m.target.hf.config, STOPS)
    assert not (tmp_path / "z" / "model.safetensors").exists()


def test_zlab_files_learned_mask_and_draft_vocabulary(tmp_path):
    m = tiny(["drafter.mask=learned", "drafter.draft_vocab=64", "head.kind=lilicorr"])
    m.drafter.set_draft_vocab(torch.arange(0, 128, 2))
    m.export(tmp_path / "e")
    lm = m.target.lm_head_weight
    warnings = write_zlab(read_export(tmp_path / "e"), tmp_path / "z", m.target.hf.config, STOPS, lm,
                          drafter_only=True)  # the head beside it (a draft vocabulary: no LiLiCorrDraftModel)
    joined = " ".join(warnings)
    for name in (MASK_EMBEDDING_FILE, "d2t", "lm_head.weight", "draft_vocab_size", "head.kind=lilicorr"):
        assert name in joined  # what SGLang / z-lab would silently ignore is named
    z = tmp_path / "z"
    cfg = json.loads((z / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"]["target_layer_ids"] == m.target.capture_ids
    assert cfg["block_size"] == m.block_size and cfg["num_hidden_layers"] == len(m.drafter.layers)
    assert cfg["num_target_layers"] == m.target.hf.config.num_hidden_layers and cfg["draft_vocab_size"] == 64
    # the learned mask's id is a stop id: generation ends there, so vLLM never swaps a generated anchor's embedding
    assert cfg["dflash_config"]["mask_token_id"] == STOPS[0]
    t = load_file(str(z / "model.safetensors"))
    assert not any(k.startswith(("drafter.", "head.", "model.")) for k in t)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight"} <= set(t)
    assert all(v.dtype == torch.bfloat16 for k, v in t.items() if k != "d2t")
    ids = m.drafter.draft_ids
    assert torch.equal(t["d2t"] + torch.arange(64), ids)  # d2t[i] = draft_id[i] - i
    assert torch.equal(t["lm_head.weight"], lm[ids].to(torch.bfloat16))
    mask = torch.load(z / MASK_EMBEDDING_FILE, weights_only=True)  # plain tensors only: loads without pickle code
    assert mask["mask_token_id"] == STOPS[0] and mask["embedding"].shape == (m.drafter.hidden_size,)
    assert set(load_file(str(z / ZLAB_HEAD_FILE))) == {f"head.{k}" for k in m.head.state_dict()}


def test_a_token_mask_keeps_its_trained_id(tmp_path):
    m = tiny(["drafter.mask=token", "head.kind=none"])
    m.export(tmp_path / "e")
    write_zlab(read_export(tmp_path / "e"), tmp_path / "z", m.target.hf.config, STOPS)
    cfg = json.loads((tmp_path / "z" / "config.json").read_text())
    assert cfg["dflash_config"]["mask_token_id"] == m.drafter.mask_token_id != STOPS[0]
    assert not (tmp_path / "z" / MASK_EMBEDDING_FILE).exists()


def test_a_full_vocabulary_exports_ranking_travels_beside_an_index_that_names_only_the_weights(tmp_path):
    """The token ranking (engine.draft_vocab reads it) is a second *.safetensors in the z-lab folder: without an
    index vLLM loads it as weights and fails ("no module or parameter named 'counts'")."""
    m = tiny(["drafter.draft_vocab=0", "head.kind=none"])
    m.export(tmp_path / "e")
    write_vocab_ranking(tmp_path / "e", torch.arange(10), torch.arange(10, 0, -1))
    write_zlab(read_export(tmp_path / "e"), tmp_path / "z", m.target.hf.config, STOPS)
    assert (tmp_path / "z" / VOCAB_RANKING_FILE).is_file()
    weights = set(load_file(str(tmp_path / "z" / "model.safetensors")))
    assert set(json.loads((tmp_path / "z" / ZLAB_INDEX_FILE).read_text())["weight_map"]) == weights
    assert not weights & set(load_file(str(tmp_path / "z" / VOCAB_RANKING_FILE)))


@pytest.mark.slow
@pytest.mark.parametrize("system", ["dflash", "lilicorr"])
def test_shipped_export_round_trips_through_the_zlab_layout(tmp_path, system):
    """jobs/export.py --layout zlab, then back into our drafter: the same weights and the same proposals."""
    import jobs.export as job

    from lilicorr.platform.assets import load_target
    from lilicorr.platform.shipped import shipped_checkpoint

    folder = shipped_checkpoint("smollm2-135m", system)
    # --drafter-only: the shipped LiLiCorr proposes from a draft vocabulary, which vLLM's LiLiCorrDraftModel refuses
    assert job.main(["--layout", "zlab", "--drafter-only", folder, str(tmp_path / "z")]) == 0
    ours, back = read_export(folder), read_export(tmp_path / "z")
    assert back.meta.layout == "zlab" and back.meta.head_kind == ours.meta.head_kind
    for a, b in ((ours.drafter_state, back.drafter_state), (ours.head_state, back.head_state)):
        assert set(a) == set(b)
        assert all(torch.equal(a[k], b[k].to(a[k].dtype)) for k in a)
    model, tok = load_target(ours.cfg.target)
    j0, j1 = JointModel.load_exported(folder, model).eval(), JointModel.load_exported(tmp_path / "z", model).eval()
    text = "The quick brown fox jumps over the lazy dog because it wants to see what lies beyond the hill."
    ids = torch.tensor([tok(text)["input_ids"]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    anchors = torch.arange(1, ids.shape[1] - 1)[None]
    props = []
    with torch.no_grad():
        for j in (j0, j1):
            b = j.build_batch(ids, mask, anchors=anchors)
            compact = {} if b.vocab_ids is None else {"vocab_ids": b.vocab_ids}
            props.append(j.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids, **compact).tokens)
    assert torch.equal(props[0], props[1])
    assert props[0].numel() > 0


def test_export_job_refuses_with_exit_2_and_the_reason(tmp_path, capsys):
    import jobs.export as job

    tiny(["drafter.qk_norm=false"]).export(tmp_path / "e")
    assert job.main(["--layout", "zlab", str(tmp_path / "e"), str(tmp_path / "z")]) == 2
    assert "refused: drafter.qk_norm=false" in capsys.readouterr().err

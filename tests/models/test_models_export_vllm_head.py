"""models/export.py's lossy conversions (issue 39 item 3), and our LiLiCorr head against vLLM's own module.

`full-vocab` and `shared-slot-bias` lift the two refusals the shipped LiLiCorr meets (an 8,192-token draft
vocabulary, two lattice layers with their own slot-bias tables): the folder then holds a model that was not
trained as such, says so, and reads back here as what it is. The last test runs vLLM's `LiLiCorrHead` on random
lattices through lilicorr/bench/vllm_lilicorr_head_side.py in .venv-vllm; without that venv it skips
(`make vllm-env` builds it; the real-prompt check is `jobs/bench.py vllm-lilicorr-head`).
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lilicorr.models.export import CONVERSIONS, ZlabRefused, read_export, write_zlab, zlab_refusal
from lilicorr.models.joint import JointModel

from test_models_export_lilicorr import SERVABLE, STOPS, tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# what the shipped LiLiCorr (v7) has that vLLM refuses, and its RMSNorm eps (ours before issue 39 item 2)
SHIPPED_LIKE = ["drafter.draft_vocab=64", "head.num_layers=2", "head.lilicorr_slot_bias=per_layer",
                "head.lilicorr_norm_eps=fixed"]


def test_each_conversion_lifts_only_its_own_refusal():
    from lilicorr.config import load_config

    cfg = load_config("tiny-random", [*SERVABLE, *SHIPPED_LIKE])
    assert "drafter.draft_vocab=64" in zlab_refusal(cfg) and "--convert full-vocab" in zlab_refusal(cfg)
    assert "per lattice layer" in zlab_refusal(cfg, convert=["full-vocab"])
    assert "--convert shared-slot-bias" in zlab_refusal(cfg, convert=["full-vocab"])
    assert "drafter.draft_vocab=64" in zlab_refusal(cfg, convert=["shared-slot-bias"])
    assert zlab_refusal(cfg, convert=["full-vocab", "shared-slot-bias"]) is None
    k3 = load_config("tiny-random", [*SERVABLE, "head.top_k=3"])
    assert "head.top_k=3" in zlab_refusal(k3, convert=list(CONVERSIONS))


def test_a_converted_export_says_what_changed_and_reads_back_as_it_is(tmp_path):
    m = tiny(SHIPPED_LIKE)
    m.export(tmp_path / "e")
    ex = read_export(tmp_path / "e")
    with pytest.raises(ValueError, match="unknown conversion"):
        write_zlab(ex, tmp_path / "x", m.target.hf.config, STOPS, convert=["fp8"])
    with pytest.raises(ZlabRefused, match="per lattice layer"):
        write_zlab(ex, tmp_path / "x", m.target.hf.config, STOPS, convert=["full-vocab"])
    assert not (tmp_path / "x").exists()
    z = tmp_path / "z"
    warnings = write_zlab(ex, z, m.target.hf.config, STOPS, convert=["shared-slot-bias", "full-vocab"])
    assert warnings[0].startswith("converted (full-vocab)") and "64-token draft vocabulary" in warnings[0]
    assert warnings[1].startswith("converted (shared-slot-bias)") and "(2 layers)" in warnings[1]
    assert all("not the model as trained" in w for w in warnings[:2])
    assert not any("d2t" in w for w in warnings)  # no draft vocabulary is written, so none to warn about
    cfg = json.loads((z / "config.json").read_text())
    assert list(cfg["lilicorr"]["converted"]) == ["full-vocab", "shared-slot-bias"] and "draft_vocab_size" not in cfg
    assert cfg["dflash_config"]["lilicorr_num_layers"] == 2
    t = load_file(str(z / "model.safetensors"))
    assert "d2t" not in t and "lm_head.weight" not in t
    layers = [m.head.lattice.layers[i].bias for i in range(2)]
    mean = (layers[0].slot_distance + layers[1].slot_distance).detach() / 2
    assert torch.allclose(t["lilicorr.relative_slot_bias"][:, 1:-1], mean.flip(-1), atol=1e-6)
    assert t["lilicorr.relative_slot_bias"][:, [0, -1]].abs().max() == 0
    assert torch.allclose(t["lilicorr.same_slot_bias"], (layers[0].same_slot + layers[1].same_slot).detach() / 2)

    back = read_export(z)
    assert back.cfg.drafter.draft_vocab == 0 and "draft_ids" not in back.drafter_state
    assert torch.equal(back.head_state["lattice.layers.0.bias.slot_distance"],
                       back.head_state["lattice.layers.1.bias.slot_distance"])
    j = JointModel.load_exported(z, m.target.hf).eval()  # our engine loads it as converted: full vocabulary
    assert j.drafter.draft_ids is None
    ids = torch.randint(4, 512, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        b = j.build_batch(ids, torch.ones_like(ids, dtype=torch.bool), anchors=torch.arange(1, 20)[None])
        assert b.slot_logits.shape[-1] == 512
        assert j.head.propose(b.slot_logits, b.slot_hidden, b.target_state, b.anchor_ids).tokens.max() < 512


def test_conversions_need_a_lilicorr_head_exported_with_it(tmp_path):
    m = tiny(SHIPPED_LIKE, perturb=False)
    m.export(tmp_path / "e")
    with pytest.raises(ValueError, match="LiLiCorrDraftModel"):
        write_zlab(read_export(tmp_path / "e"), tmp_path / "z", m.target.hf.config, STOPS,
                   lm_head_weight=m.target.hf.get_output_embeddings().weight, drafter_only=True,
                   convert=["full-vocab"])


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no .venv-vllm (make vllm-env)")
def test_vllm_s_head_scores_our_lattices_as_ours(tmp_path):
    """vLLM's LiLiCorrHead, loaded from our export of a perturbed tiny head, on random lattices: scores within 1e-4
    of ours converted to its RMSNorm eps (the drafter's rms_norm_eps), and the same greedy walk (~16 s)."""
    from lilicorr.bench.vllm_lilicorr_head import SIDE, compare, our_scores
    from lilicorr.bench.vllm_peer import theirs

    m = tiny()
    m.export(tmp_path / "e")
    z = tmp_path / "z"
    write_zlab(read_export(tmp_path / "e"), z, m.target.hf.config, STOPS)
    (tmp_path / "t").mkdir()
    emb = m.target.hf.get_input_embeddings().weight.detach().float().contiguous()
    save_file({"model.embed_tokens.weight": emb}, str(tmp_path / "t" / "model.safetensors"))
    head = JointModel.load_exported(z, m.target.hf).head.eval()
    n, s, k, g = 16, head.S, head.K, torch.Generator().manual_seed(0)
    lat = {"cand_ids": torch.randint(0, emb.shape[0], (n, s, k), generator=g),
           "logprobs": torch.log_softmax(torch.randn(n, s, 64, generator=g) * 3, -1).sort(-1, descending=True)
           .values[..., :k].contiguous(),
           "slot_hidden": torch.randn(n, s, m.drafter.hidden_size, generator=g),
           "anchor_hidden": torch.randn(n, m.drafter.hidden_size, generator=g)}
    torch.save(lat, tmp_path / "lat.pt")
    spec = {"export": str(z), "target": str(tmp_path / "t"), "lattices": str(tmp_path / "lat.pt"),
            "out": str(tmp_path / "theirs.pt")}
    side = theirs(str(VLLM_PYTHON), spec, 300, script=SIDE)
    ours = sum(p.numel() for p in head.parameters())
    assert side["blocks"] == n and side["head_parameters"] == ours + 2 * head.cfg.num_heads  # 2B-1 vs 2(B-1)-1
    th = torch.load(tmp_path / "theirs.pt", weights_only=True)
    th = (th["start"], th["pair"], th["path"])
    lat["target_state"] = torch.zeros(n, 1)
    got = compare(our_scores(head, lat, eps=json.loads((z / "config.json").read_text())["rms_norm_eps"]), th)
    assert got["worst_start_diff"] < 1e-4 and got["worst_pair_diff"] < 1e-4 and got["walk_agree_blocks"] == n


def test_the_job_names_an_unknown_or_insufficient_conversion(tmp_path, capsys):
    """jobs/export.py --convert, on a LiLiCorr like v7 (shipped before v8): both answered before the target loads."""
    import jobs.export as job

    tiny(SHIPPED_LIKE, perturb=False).export(tmp_path / "v7like")
    shipped = str(tmp_path / "v7like")
    assert job.main(["--layout", "zlab", "--convert", "fp8", shipped, str(tmp_path / "z")]) == 2
    assert "unknown conversion" in capsys.readouterr().err
    assert job.main(["--layout", "zlab", "--convert", "full-vocab", shipped, str(tmp_path / "z")]) == 2
    err = capsys.readouterr().err
    assert "refused: head.lilicorr_slot_bias=per_layer with head.num_layers=2" in err
    assert "--convert shared-slot-bias" in err
    assert not (tmp_path / "z").exists()

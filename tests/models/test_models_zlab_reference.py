"""Our DFlash drafter against an independent implementation: z-lab's `DFlashDraftModel` (pip `dflash==0.1.0`,
installed with --no-deps by `make install`; their code is imported, never copied here).

A random drafter on a small Qwen3-shaped target goes out through our z-lab writer (models/export.py) and is
loaded by *their* `from_pretrained`, so the test checks the layout as well as the arithmetic. Both then get the
same captured target states (each extracting them its own way) and the same block, and the block's logits
through the target's LM head must agree in fp32. Norm weights are perturbed away from ones so that every norm
(q/k norms on context keys too) counts."""

import pytest
import torch

from lilicorr.config import load_config
from lilicorr.models.export import read_export, write_zlab
from lilicorr.models.joint import JointModel
from lilicorr.models.target import build_random_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

T, STOPS = 11, [3]  # context length before the anchor; the tiny target's stop id


def _exported_pair(tmp_path, mask: str):
    from dflash import DFlashDraftModel

    cfg = load_config("tiny-random", ["target.arch=qwen3", "target.vocab_size=512", "target.num_layers=8",
                                      "drafter.num_layers=3", "drafter.block_size=6", f"drafter.mask={mask}"])
    torch.manual_seed(0)
    m = JointModel(cfg, build_random_target(cfg.target))
    with torch.no_grad():
        for name, p in m.drafter.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if "norm" in name else 0.02))
        # bf16-representable weights: the z-lab layout is bf16, so both models then hold exactly these values
        for p in m.drafter.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    m.export(tmp_path / "ours")
    write_zlab(read_export(tmp_path / "ours"), tmp_path / "zlab", m.target.hf.config, STOPS, drafter_only=True)
    theirs = DFlashDraftModel.from_pretrained(str(tmp_path / "zlab"), dtype=torch.float32).eval()
    return m.eval(), theirs


@pytest.mark.parametrize("mask", ["token", "learned"])
def test_block_logits_match_zlab_reference(tmp_path, mask):
    from dflash import extract_context_feature

    m, theirs = _exported_pair(tmp_path, mask)
    target, drafter = m.target, m.drafter
    assert theirs.target_layer_ids == target.capture_ids and theirs.block_size == drafter.block_size
    B = drafter.block_size
    ids = torch.randint(0, 512, (1, T + 1), generator=torch.Generator().manual_seed(1))  # context + anchor
    with torch.no_grad():
        hf_out = target.hf(ids[:, :T], output_hidden_states=True)
        their_ctx = extract_context_feature(hf_out.hidden_states, theirs.target_layer_ids)  # (1, T, n*H)
        our_ctx = target.teacher_forced(ids[:, :T]).captured
        assert torch.allclose(their_ctx, our_ctx, atol=1e-5)  # the same capture convention

        if mask == "token":  # z-lab embeds the mask id its config names with the target's embedding
            block_ids = torch.full((1, B), theirs.mask_token_id)
            block_ids[0, 0] = ids[0, T]
            noise = target.hf.get_input_embeddings()(block_ids)
        else:  # a learned mask vector: z-lab has none, so both get our block inputs
            noise = drafter.embed_blocks(ids[:, T], target.embed)  # (1, B, H)
        pos = torch.arange(T + B)[None]
        h_theirs = theirs(position_ids=pos, noise_embedding=noise, target_hidden=their_ctx)  # (1, B, H)
        logits_theirs = theirs.compute_logits(h_theirs, target.hf.get_output_embeddings())

        ctx = drafter.fuse_context(our_ctx)
        kv = drafter.project_context(ctx, pos[:, :T])
        h_ours = drafter.forward_block(noise, pos[:, T:], kv, torch.ones(1, T, dtype=torch.bool))
        logits_ours = drafter.logits(h_ours, target.lm_head_weight)
        # the training form, one anchor at T: the same block seen through the training mask
        h_train = drafter.forward_train(our_ctx, noise[:, None], torch.tensor([[T]]))[:, 0]
    assert logits_theirs.shape == logits_ours.shape == (1, B, 512)
    assert (logits_theirs - logits_ours).abs().max() < 1e-4
    assert (h_train - h_ours).abs().max() < 1e-4
    assert logits_ours.std() > 0.01  # a real signal, not two zero vectors agreeing

"""What a decoder keeps for a LiLiCorr head's inference: the path its proposals take and the tables derived from
the head's parameters (HeadInference), and the head's tensors in the order the C kernel reads them.

The engine (engine/drafting.py) builds one HeadInference per decoder from its BackendPlan and passes it to every
`LiLiCorrHead.propose`; the one-row C call (heads/lilicorr_native.py) keeps its tables there. The head holds none of
it. The head's other proposals (2+ rows, or a row the C call does not take) run its modules: a TorchScript form of
them measured no faster at 12 rows and was deleted (docs/results.md, "One path per computation").
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor


def _wb(m) -> List[Tensor]:
    return [m.weight, m.bias]


def head_weights(head) -> Tuple[List[Tensor], List[List[Tensor]]]:
    """The head's tensors in the C kernel's order (read per call: an optimizer step or a load is picked up): w =
    embed_proj w/b, hidden_proj w/b, feature_norm w/b (or placeholders), conf_mlp 0 w/b, 2 w/b, slot_table,
    rank_table, final norm, fuse w/b, out_head w/b, in_head w/b, anchor_head w/b; layers[i] = attn_norm, qkv w/b,
    proj w/b, the attention bias (options() fills it in), (unused), ffn_norm, ffn_in w/b, ffn_out w/b."""
    fn = head.feature_norm
    ln = _wb(fn) if isinstance(fn, torch.nn.LayerNorm) else [head.embed_proj.weight, head.embed_proj.weight]
    w = (_wb(head.embed_proj) + _wb(head.hidden_proj) + ln + _wb(head.conf_mlp[0]) + _wb(head.conf_mlp[2])
         + [head.slot_table.weight, head.rank_table.weight, head.lattice.norm.weight] + _wb(head.fuse)
         + _wb(head.out_head) + _wb(head.in_head) + _wb(head.anchor_head))
    layers = [[L.attn_norm.weight, *_wb(L.qkv), *_wb(L.proj), b.slot_distance, b.same_slot,
               L.ffn_norm.weight, *_wb(L.ffn_in), *_wb(L.ffn_out)]
              for L, b in zip(head.lattice.layers, head.lattice.layer_biases())]
    return w, layers


def stamp(sources: List[Tensor]) -> tuple:
    """What says a tensor changed: its storage, its in-place version and its shape."""
    return tuple((x.data_ptr(), x._version, x.shape) for x in sources)


class HeadInference:
    """What a decoder keeps for one LiLiCorr head's inference: whether its one-row greedy fp32 proposals take the C
    call (`native`: engine/backend.py chose it; engine/drafting.py builds this and passes it to every `propose`) and
    the tables derived from the head's parameters, made once and remade when one of their parameters changes (its
    storage or in-place version: an optimizer step, load_state_dict, module.to). The head holds none of it: two
    decoders over one head, or a training loop beside a decoder, never see each other's choice or tables."""

    def __init__(self, native: bool = False):
        self.native = native
        self._tables: dict = {}
        self.native_plan = None  # heads/lilicorr_native.py's _Plan, made on the first one-row call
        self.native_sources = None  # (vocab_ids, the tensors the plan derives from)
        self.native_args = None  # (S, the kernel's head-side arguments, their sources)

    def derived(self, name: str, key: tuple, sources: List[Tensor], build):
        """build()'s tensors kept until `key` or one of `sources` changes: weights derived from parameters, made
        once, not per block."""
        full = (key, stamp(sources))
        found = self._tables.get(name)
        if found is None or found[0] != full:
            with torch.no_grad():
                found = (full, build())
            self._tables[name] = found
        return found[1]


def attention_biases(head, S: int, K: int, tables: Optional[HeadInference] = None) -> List[Tensor]:
    """Each lattice layer's LatticeAttentionBias(S, K) (its own forward), kept in `tables` until its parameters
    change: an index over a (heads, 2S-1) table that was two of the pass's costliest small ops when redone per block.
    tables None: made afresh."""
    def build():
        return [b(S, K).detach() for b in head.lattice.layer_biases()]

    if tables is None:
        with torch.no_grad():
            return build()
    params = [t for b in head.lattice.layer_biases() for t in (b.slot_distance, b.same_slot)]
    return tables.derived("biases", (S, K), params, build)


def options(head, S: int, K: int, tables: Optional[HeadInference] = None
            ) -> Tuple[List[Tensor], List[List[Tensor]], bool, bool, float, int, float, float]:
    """The kernel's arguments that come from the head: (w, layers, rms_embed, layernorm, ln_eps, num_heads, eps,
    sigma)."""
    w, layers = head_weights(head)
    for p, b in zip(layers, attention_biases(head, S, K, tables)):
        p[5] = b
    fn = head.feature_norm
    layernorm = isinstance(fn, torch.nn.LayerNorm)
    first = head.lattice.layers[0] if head.lattice.layers else None
    return (w, layers, head.choices["embed"] == "rms", layernorm, float(fn.eps) if layernorm else 1e-5,
            first.num_heads if first is not None else 1, float(head.lattice.norm.eps),  # every lattice RMSNorm's
            float(head.cfg.sigma))

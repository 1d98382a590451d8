"""Rewrite a trained export in another engine's layout (lilicorr/models/export.py).

    python jobs/export.py --layout zlab [--drafter-only | --convert full-vocab,shared-slot-bias] EXPORT_DIR OUT_DIR
    python jobs/export.py --layout lilicorr --convert full-vocab EXPORT_DIR OUT_DIR

`zlab`: the layout vLLM (speculative method "dflash"), SGLang and z-lab's code load (README "Serve a drafter
trained here in vLLM / SGLang"). A LiLiCorr export becomes their `LiLiCorrDraftModel` (the drafter plus the head
under `lilicorr.`, served with num_speculative_tokens = block_size - 1 as trained); `--drafter-only` writes the
drafter alone (`DFlashDraftModel`, vanilla DFlash drafts) with the head beside it in our layout. The target is
loaded from the export's own config (its shapes, stop ids and, for a draft vocabulary, its LM head rows). What no
engine can load as trained is refused (exit 2, the reason and the fix on stderr); what SGLang / z-lab would
silently ignore, or compute slightly otherwise, is printed as a warning naming the fields. `--convert` lifts a
LiLiCorr refusal by a named lossy conversion (models/export.py CONVERSIONS: `full-vocab` drops a draft vocabulary,
`shared-slot-bias` writes the mean of the lattice layers' attention-bias tables): the folder then holds a model that
was not trained as such, and says so (a warning per conversion, config.json's `lilicorr.converted`).
`lilicorr --convert full-vocab`: our own layout without the draft vocabulary (any head; config.json's `converted`):
the drafter's LM head is the target's, so this only lets it propose over every token, as a run continuing it with
drafter.draft_vocab=0 starts; measure it (validation τ, jobs/bench.py acceptance) before shipping it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for `python jobs/...`


def main(argv=None) -> int:
    from lilicorr.models.export import ExportMissing, ZlabRefused
    from lilicorr.platform.export_layouts import LAYOUTS, export_layout

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", required=True, choices=LAYOUTS)
    p.add_argument("--drafter-only", action="store_true",
                   help="zlab: the drafter alone (DFlashDraftModel), a head beside it in our layout")
    p.add_argument("--convert", default="", metavar="NAME[,NAME]",
                   help="zlab, LiLiCorr: lossy conversions that lift a refusal (full-vocab, shared-slot-bias); the "
                        "result is not the model as trained: measure it (jobs/bench.py vllm-lilicorr-head)")
    p.add_argument("export_dir")
    p.add_argument("out_dir")
    args = p.parse_args(argv)
    try:
        warnings = export_layout(args.layout, args.export_dir, args.out_dir, args.drafter_only,
                                 [c for c in args.convert.split(",") if c])
    except ZlabRefused as e:
        print(f"[export] refused: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # an unknown conversion, or one that does not apply
        print(f"[export] {e}", file=sys.stderr)
        return 2
    except ExportMissing as e:
        print(f"[export] {e}: EXPORT_DIR must be a jobs/train.py export (train.output_dir/export)", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"[export] warning: {w}", file=sys.stderr)
    print(json.dumps({"layout": args.layout, "out_dir": args.out_dir, "warnings": warnings}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

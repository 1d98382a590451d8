"""Shared command-line parsing for jobs: `--preset NAME` plus `section.field=value` overrides.

The config is resolved here, before a job imports torch, Ray or MLflow, so a bad preset, key or
value, or a missing input path (a config field or --checkpoint), is reported (naming it) in well under 2 s.

    args, cfg = parse_job_args("Train drafter + head", add_arguments=lambda p: p.add_argument("--head"))
"""

from __future__ import annotations

import argparse
from typing import Callable, Optional, Sequence

from lilicorr.config import PRESETS, Config, ConfigError, load_config
from lilicorr.config.overrides import read_config_file
from lilicorr.config.paths import checkpoint_arg


def parse_job_args(description: str, add_arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None,
                   argv: Optional[Sequence[str]] = None, default_preset: str = "smollm2-135m",
                   ) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--preset", default=default_preset, help=f"config preset: {', '.join(PRESETS)}")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML or JSON of section.field: value, applied before the command-line overrides")
    if add_arguments is not None:
        add_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="section.field=value",
                        help="config overrides, e.g. head.top_k=4 train.max_steps=50")
    args = parser.parse_intermixed_args(argv)
    try:
        # the file's settings join args.overrides, ahead of the command line's: a job that rebuilds its config
        # from args.overrides (demo, train_shipped, compare_levers, ablate_head) sees them too
        args.overrides = [*(read_config_file(args.config) if args.config else []), *args.overrides]
        cfg = load_config(args.preset, args.overrides)
        if isinstance(getattr(args, "checkpoint", None), str):  # a job's --checkpoint: made absolute, or refused
            args.checkpoint = checkpoint_arg(args.checkpoint)
    except ConfigError as e:
        parser.exit(2, f"{parser.prog}: config error: {e}\n")
    return args, cfg

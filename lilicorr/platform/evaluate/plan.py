"""What an evaluation runs: systems x benchmarks x settings as cells, and which export each system uses.

Systems are the engine's (lilicorr.engine.systems) plus two external peers on the same target and
prompts: `hf` (transformers `generate`, greedy or sampling) and `hf-pld` (its prompt-lookup decoding).
Every (system, benchmark, temperature, seed, concurrency) is one cell; AR is added to every setting that
lacks it, since speedups are measured against AR in the same evaluation. At T = 0 decoding is
deterministic, so only the first seed runs there.

Checkpoints (system -> export): dflash and ddtree use the `dflash` export, lilicorr and lilicorr-viterbi
the `lilicorr` export, lilicorr-margin `lilicorr-margin` (trained with loss.mu > 0), domino `domino`,
dspark and dspark-sampled `dspark`. `--checkpoint` names one export (used by the systems its head fits),
a folder of exports named as above, or `name=SPEC,...`; a SPEC may be `models:/NAME@ALIAS`. Without it
the shipped `checkpoints/<preset>/<name>/` are used. A system with no export is skipped with the reason,
unless `--drafter random`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from lilicorr.platform.shipped import CHECKPOINTS
from lilicorr.platform.shipped import EXPORT_OF_SYSTEM as EXPORT_OF

PEERS = ("hf", "hf-pld")
HEAD_OF_EXPORT = {"dflash": "none", "lilicorr": "lilicorr", "lilicorr-margin": "lilicorr", "domino": "domino",
                  "dspark": "dspark"}


@dataclass(frozen=True)
class Cell:
    system: str
    benchmark: str
    temperature: float
    seed: int
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.system}|{self.benchmark}|T{self.temperature:g}|s{self.seed}|c{self.concurrency}"

    @property
    def setting(self) -> tuple:
        """What a speedup is measured within: the AR cell with the same setting."""
        return (self.benchmark, self.temperature, self.seed, self.concurrency)

    def run_name(self) -> str:
        return "eval-" + self.key.replace("|", "-")  # eval-SYSTEM-BENCH-T0-s0-c1


@dataclass
class Plan:
    cells: list[Cell] = field(default_factory=list)
    checkpoints: dict[str, Optional[str]] = field(default_factory=dict)  # system -> local folder (None = random/AR)
    source_runs: dict[str, str] = field(default_factory=dict)  # system -> training run of its export
    export_loss: dict[str, dict] = field(default_factory=dict)  # system -> loss settings its export was trained with
    skipped: dict[str, str] = field(default_factory=dict)  # "system" or "benchmark:name" -> reason
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"cells": [asdict(c) for c in self.cells], "checkpoints": self.checkpoints,
                "source_runs": self.source_runs, "export_loss": self.export_loss, "skipped": self.skipped, "notes": self.notes}

    def use_export(self, system: str, spec: str) -> None:
        """`system` decodes with export `spec` (a folder or model URI): its folder, loss settings and training run."""
        from lilicorr.platform.tracking import resolve_checkpoint

        folder, run_id = resolve_checkpoint(spec)
        self.checkpoints[system], self.export_loss[system] = folder, export_loss(folder)
        if run_id:
            self.source_runs[system] = run_id


def known_systems() -> tuple[str, ...]:
    from lilicorr.engine.systems import SYSTEMS

    return (*SYSTEMS, *PEERS)


def export_loss(folder: str) -> dict:
    """The loss settings (γ, λ, μ, ρ) an export was trained with: Table 11 groups cells by them."""
    from lilicorr.models.export import read_meta  # torch only when an export is read

    return read_meta(folder).loss


def export_folders(spec: Optional[str], preset: str) -> dict[str, str]:
    """{export name: folder or model URI} from a --checkpoint spec (None: the shipped checkpoints, if any yet)."""
    from lilicorr.platform.tracking import is_model_uri, resolve_checkpoint

    if spec is None:
        spec = str(CHECKPOINTS / preset)  # the shipped exports (lilicorr.platform.shipped)
    elif "=" in spec.split(":/", 1)[0]:
        out = {}
        for item in spec.split(","):
            name, _, path = item.partition("=")
            if name not in HEAD_OF_EXPORT:
                raise ValueError(f"--checkpoint: unknown export name {name!r}; known: {', '.join(HEAD_OF_EXPORT)}")
            out[name] = path
        return out
    else:
        if is_model_uri(spec):
            spec, _ = resolve_checkpoint(spec)
        if (Path(spec) / "config.json").exists():  # one export: it serves the systems its head fits
            from lilicorr.models.export import read_meta

            meta = read_meta(spec)
            mu = float(meta.loss.get("mu", 0.0) or 0.0)
            return {n: spec for n, h in HEAD_OF_EXPORT.items()
                    if h == meta.head_kind and (n != "lilicorr-margin" or mu > 0)}
        if not Path(spec).is_dir():
            raise ValueError(f"--checkpoint {spec!r}: neither an export (config.json), a folder of exports, "
                             "nor a model URI")
    return {n: str(Path(spec) / n) for n in HEAD_OF_EXPORT if (Path(spec) / n / "config.json").exists()}


def build_plan(systems: list[str], benchmarks: list[str], temperatures: list[float], seeds: list[int],
               concurrency: list[int], preset: str, checkpoint: Optional[str] = None,
               random_drafter: bool = False) -> Plan:
    """Cells for the systems that can run; the others in `plan.skipped` with the reason."""
    from lilicorr.engine.systems import SYSTEMS

    plan = Plan()
    for s in systems:
        if s not in known_systems():
            raise ValueError(f"unknown system {s!r}; known: {', '.join(known_systems())}")
    if "ar" not in systems:
        systems = ["ar", *systems]
        plan.notes.append("ar added: speedups are measured against AR in the same evaluation")
    exports = {} if random_drafter else export_folders(checkpoint, preset)
    if checkpoint is None and not random_drafter:
        plan.notes.append(f"exports from {CHECKPOINTS / preset}: {', '.join(exports) or 'none yet'}")
    runnable = []
    for s in systems:
        if s in PEERS or SYSTEMS[s].head_kind is None or random_drafter:
            plan.checkpoints[s] = None
            runnable.append(s)
            continue
        name = EXPORT_OF[s]
        if name not in exports:
            plan.skipped[s] = (f"no {name!r} export (system {s} uses it): pass --checkpoint {name}=DIR or "
                               f"--drafter random")
            continue
        plan.use_export(s, exports[name])
        runnable.append(s)
    seeds = seeds or [0]
    for bench in benchmarks:
        for t in temperatures:
            for seed in (seeds if t > 0 else seeds[:1]):
                for c in concurrency:
                    for s in runnable:
                        if s == "hf-pld" and c > 1:
                            plan.skipped.setdefault(f"hf-pld-c{c}", "transformers prompt-lookup decoding runs "
                                                    "at batch size 1 only")
                            continue
                        plan.cells.append(Cell(s, bench, float(t), int(seed), int(c)))
    return plan

"""Labelled systems: one engine system with another export in the same evaluation, `SYSTEM@LABEL`.

`dflash@shipped` decodes as `dflash` with the export given for that label, so one evaluation (one
target load, one AR baseline) compares a system's freshly trained export with another of the same head
(the demo: its trained drafters beside the shipped ones). The label stays in the cell's system name,
so its runs, tables and figures keep it apart from the unlabelled system.
"""

from __future__ import annotations

from lilicorr.platform.evaluate.plan import EXPORT_OF, Cell, Plan

SEP = "@"


def engine_system(system: str) -> str:
    """The system that decodes a (possibly labelled) cell: `dflash@shipped` -> `dflash`."""
    return system.split(SEP, 1)[0]


def add_labelled(plan: Plan, labelled: dict[str, str], benchmarks: list[str]) -> None:
    """Cells for each `SYSTEM@LABEL -> export folder` at every setting the plan already has."""
    settings = list(dict.fromkeys((c.temperature, c.seed, c.concurrency) for c in plan.cells))
    for name, spec in labelled.items():
        base = engine_system(name)
        if SEP not in name or base not in EXPORT_OF:
            raise ValueError(f"labelled system {name!r}: expected SYSTEM{SEP}LABEL with a drafter system "
                             f"({', '.join(EXPORT_OF)})")
        plan.use_export(name, spec)
        plan.cells += [Cell(name, b, t, s, c) for b in benchmarks for (t, s, c) in settings]

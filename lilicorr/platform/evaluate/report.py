"""The evaluation report: the paper's tables and plots for the cells of an evaluation or an experiment.

    rep = write_report("outputs/eval/report", run_id=PARENT)     # or experiment="lilicorr"
    print(rep.markdown)

Writes report.md, one CSV per table and PNG plots to the folder, and logs them back to MLflow: to the
given run, or for an experiment to a new `report` run in it (`log_table` for each table's numbers,
`log_figure` for each plot, report.md as text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from lilicorr.platform.evaluate.plots import PLOTS
from lilicorr.platform.evaluate.records import load_records
from lilicorr.platform.evaluate.tables import Table, build_tables


@dataclass
class Report:
    markdown: str
    files: list[str] = field(default_factory=list)
    run_id: Optional[str] = None  # where it was logged


def render_markdown(tables: list[Table], skipped: dict[str, str], source: str) -> str:
    parts = [f"# Evaluation report ({source})", ""]
    for t in tables:
        parts += [t.markdown(), ""]
    if not tables:
        parts += ["No finished evaluation cells found.", ""]
    if skipped:
        parts += ["**Skipped**", ""] + [f"- {k}: {v}" for k, v in sorted(skipped.items())] + [""]
    return "\n".join(parts)


def write_report(out_dir: str, experiment: Optional[str] = None, run_id: Optional[str] = None,
                 tracking_uri: Optional[str] = None, log: bool = True) -> Report:
    import pandas as pd
    from mlflow import MlflowClient

    from lilicorr.platform.tracking import GIT_TAG, absolute_uri, git_commit
    from lilicorr.platform.tracking import tracking_uri as default_uri

    uri = absolute_uri(tracking_uri or default_uri())
    client = MlflowClient(uri)
    recs = load_records(client, experiment=experiment, run_id=run_id)
    tables = build_tables(recs.records)
    source = f"run {run_id}" if run_id else f"experiment {experiment}"
    md = render_markdown(tables, recs.skipped, source)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [str(out / "report.md")]
    (out / "report.md").write_text(md)
    for t in tables:
        (out / f"{t.name}.csv").write_text(t.csv())
        (out / f"{t.name}.md").write_text(t.markdown() + "\n")
        files += [str(out / f"{t.name}.csv"), str(out / f"{t.name}.md")]
    figures = {name: fig for name, make in PLOTS.items() if (fig := make(recs.records)) is not None}
    for name, fig in figures.items():
        fig.savefig(out / f"{name}.png", dpi=120)
        files.append(str(out / f"{name}.png"))
    target = run_id
    if log:
        if target is None:
            run = client.create_run(recs.experiment_id, run_name=f"report-{experiment}",
                                    tags={"job": "report", GIT_TAG: git_commit()})
            target = run.info.run_id
        client.log_text(target, md, "report/report.md")
        for t in tables:
            if t.data:
                client.log_table(target, data=pd.DataFrame(t.data), artifact_file=f"report/{t.name}.json")
            client.log_text(target, t.csv(), f"report/{t.name}.csv")
        for name, fig in figures.items():
            client.log_figure(target, fig, f"report/{name}.png")
        if run_id is None:
            client.set_terminated(target)
    import matplotlib.pyplot as plt

    for fig in figures.values():
        plt.close(fig)
    return Report(markdown=md, files=files, run_id=target)

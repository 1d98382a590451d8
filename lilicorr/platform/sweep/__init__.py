"""Ray Tune sweeps over training settings (γ, λ, μ, ρ, ...) and the paper's ablations (jobs/sweep.py).

    space.py     sweep.space entries parsed + checked like overrides, Tune domains, the sweep's name
    trial.py     the function trainable: the driver's train() with reports forwarded to Tune
    runner.py    stage one (search, ASHA), stage two (best configs x seeds), Tuner.restore on rerun
    runs.py      MLflow parent run per sweep, child run per trial
    results.py   per-trial records, grouping over seeds, tables, the τ figure
    report.py    the end of a sweep: tables, figure, best trial tagged, best_config.yaml
    ablations.py named ablation presets (Tables 11, 15, 12)
    confirm.py   engine-measured τ of the top configs / ablation arms (the evaluation job)
"""

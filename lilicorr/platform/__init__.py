"""Ray + MLflow side of the platform: config, assets, tracking, data, training, sweeps, evaluation."""

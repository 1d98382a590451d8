"""Ray Train + DeepSpeed joint training: driver.py launches TorchTrainer, worker.py is the per-rank loop."""

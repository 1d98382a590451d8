"""The speculative decoder every job uses. Never imports Ray, DeepSpeed or MLflow."""

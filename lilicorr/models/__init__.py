"""Plain torch modules: target adapter, DFlash drafter, LiLiCorr and baseline heads, losses, decode rules.

Never imports Ray, DeepSpeed or MLflow (GPU boxes without them must run this).
"""

"""LiLiCorr speculative decoding."""

"""Ray Data regeneration: source rows -> target-generated answers -> tokenized Parquet shards + manifest (pipeline.py is the entry)."""

"""Decoder Lab benchmarks: each runs as `python -m bench.<name>` from the repository root and prints JSON lines."""

"""Benchmarks: runnable modules (`python -m bench.ingest`) that print figures and ratios, not tests."""

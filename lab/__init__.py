"""Benchmarks (not tests): our training step against transformers', and train.py's bookkeeping cost."""

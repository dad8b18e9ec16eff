"""Checkpoints: saving and loading them in one format for every strategy, resuming exactly, starting from
another run's weights, and exporting to Hugging Face."""

"""Training under accelerate: configuration, the loop, metrics, strategies and checkpoints."""

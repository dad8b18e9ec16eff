"""What a run records: the schema of its figures, the launch and summary records, the metrics, the sinks they
go to, and the device facts they divide by (peak FLOP/s and memory)."""

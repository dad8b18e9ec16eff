"""The planner: what a run will need and cost before it starts (memory per device, fit, step time), the GPUs
it plans for, and the launch it recommends. `python -m planner --help`."""

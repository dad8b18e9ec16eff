"""The processes of a run: the strategies, the accelerator that puts one in effect, the speed levers, and one
process failing alone."""

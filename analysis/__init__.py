"""Cross-run comparison of the strategies: load run directories, tabulate, plot, write a report.

`python -m analysis.compare RUN_DIR... --out DIR` compares finished runs;
`python -m analysis.experiment --preset NAME --max_steps N --out DIR` trains every strategy with the
same seed, data and global batch and then compares them.
"""

from planner.cli import main
from training.cli import run_main

run_main(main)

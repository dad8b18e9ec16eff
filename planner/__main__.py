from planner.plan import main
from training.cli import run_main

run_main(main)

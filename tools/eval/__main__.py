from tools.errors import run_cli
from tools.eval.cli import main

run_cli(main)

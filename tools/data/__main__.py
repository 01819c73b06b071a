from tools.data.cli import main
from tools.errors import run_cli

run_cli(main)

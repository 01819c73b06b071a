"""Dataset converters: public math datasets -> verl's RL parquet (`python -m tools.data --help`)."""

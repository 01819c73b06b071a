"""ascend-r1 tests (a regular package, so `tests` is never verl's when verl is installed editable)."""

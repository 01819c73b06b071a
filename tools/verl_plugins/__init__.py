"""Code verl loads by name inside its Ray workers (a recipe names the module): the CPU checkpoint engine
(gloo_engine)."""

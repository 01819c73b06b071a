"""ascend-r1 tools: patch series, environments, weights, data, rewards, and the rooms of a run:
launch (the `make train` runtime), recipes, plan, report, analysis, cluster, miniature, verl_plugins."""

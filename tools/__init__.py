"""ascend-r1 tools: patch series, weights, data, rewards and launch."""

"""Training a draft head on the target's own hidden states (edge-spec head train)."""

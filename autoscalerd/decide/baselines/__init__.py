"""autoscalerd.decide.baselines."""

"""autoscalerd.decide."""

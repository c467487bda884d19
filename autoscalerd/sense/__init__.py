"""autoscalerd.sense."""

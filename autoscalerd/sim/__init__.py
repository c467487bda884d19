"""autoscalerd.sim."""

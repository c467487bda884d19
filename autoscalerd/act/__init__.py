"""autoscalerd.act."""

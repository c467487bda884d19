"""First-party actuator plugins, registered through the `autoscalerd.actuators` entry points."""

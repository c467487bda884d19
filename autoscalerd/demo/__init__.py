"""`autoscalerd demo`: a live run against an embedded local Ray cluster, with a report."""

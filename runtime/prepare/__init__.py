"""Model preparation jobs: what a version's preparation step runs in its Kubernetes Job."""

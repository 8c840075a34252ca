"""The deployment targets behind the cloud seam (``components.core.cloud``): one package per target (``aws`` for
EKS, ``own_cluster`` for a cluster you bring), each with its profile, registered in ``targets.PROFILES``. A second
target is a new package here and one entry there."""

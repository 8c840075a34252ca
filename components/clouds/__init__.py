"""The deployment targets behind the cloud seam (``components.core.cloud``): one implementation per target
(``aws`` for EKS, ``own_cluster`` for a cluster you bring), picked by ``targets.cloud_for``. A second cloud is a
new package here and one entry in ``targets.CLOUDS``."""

"""What AWS bills for a stack besides its GPU instances: the EKS control plane, the system nodes, NAT gateways,
gp3 root disks and KMS keys. Pure data and arithmetic.

Read with the GPU instances' price list (``catalog.EC2_PRICES``: same source, region and date). The AWS cloud
prices its fixed infrastructure with these (``AwsCloud.fixed_costs``), and the policy pack's budget rule prices
the same resources read from the plan, so `inferstack plan`'s bill and the policy agree.
"""

from __future__ import annotations

from components.core.cloud import RootDisk

# A CPU instance for the system node group (gateway, monitoring) and its price, same source and date.
SYSTEM_INSTANCE_TYPE = "m7i.xlarge"
SYSTEM_INSTANCE_USD_PER_HOUR = 0.2016
EKS_CONTROL_PLANE_USD_PER_HOUR = 0.10
NAT_GATEWAY_USD_PER_HOUR = 0.045  # per gateway-hour; data processed ($0.045/GB) is usage, not in the plan
# EBS gp3 (root disks of nodes) and KMS, same region and date: storage, provisioned IOPS above the baseline
# (3,000) and throughput above the baseline (125 MiB/s) are billed per month.
EBS_GP3_BASELINE_IOPS = 3000
EBS_GP3_BASELINE_THROUGHPUT_MIBPS = 125
EBS_GP3_USD_PER_GIB_MONTH = 0.08
EBS_GP3_USD_PER_IOPS_MONTH = 0.005
EBS_GP3_USD_PER_MIBPS_MONTH = 0.04
KMS_KEY_USD_PER_MONTH = 1.0


def gp3_disk_usd_month(gib: float, iops: float, throughput_mibps: float) -> float:
    """One gp3 volume a month: its size, plus the IOPS and throughput bought above the gp3 baseline."""
    return (
        gib * EBS_GP3_USD_PER_GIB_MONTH
        + max(0, iops - EBS_GP3_BASELINE_IOPS) * EBS_GP3_USD_PER_IOPS_MONTH
        + max(0, throughput_mibps - EBS_GP3_BASELINE_THROUGHPUT_MIBPS) * EBS_GP3_USD_PER_MIBPS_MONTH
    )


def root_disk_usd_month(disk: RootDisk) -> float:
    return gp3_disk_usd_month(disk.gib, disk.iops, disk.throughput_mibps)

"""The pack boots the way Pulumi runs it (`python policies/inference`): it serves the analyzer on a local
port and describes every policy. The process is ours; it is stopped at the end."""

from __future__ import annotations

import subprocess
import sys

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import analyzer_pb2_grpc

from policies.inference.rules import RULES
from tests.processes import child


def test_pack_serves_its_policies() -> None:
    with child(
        [sys.executable, "-u", "policies/inference"], stdout=subprocess.PIPE, stop_timeout_s=10
    ) as process:
        assert process.stdout is not None
        port = process.stdout.readline().strip()
        assert port.isdigit(), (port, process.poll())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        info = analyzer_pb2_grpc.AnalyzerStub(channel).GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
        channel.close()
        assert info.name == "inferstack-inference"
        assert [p.name for p in info.policies] == [r.name for r in RULES]
        budget = next(p for p in info.policies if p.name == "monthly-cost-within-budget")
        assert "monthly_budget_usd" in budget.configSchema.properties

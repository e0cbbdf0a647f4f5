"""`make synth`'s deploy summary (`python -m tools.deploy_summary cdk.out`).

What `cdk deploy` would create, read from a synthesized cloud assembly: stacks, resources by type, and the
monthly cost drivers of leaving the platform running (list prices, us-east-1, before any training job runs).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from jobs.prices import HOURS_PER_MONTH

# us-east-1 list prices (USD), November 2026. Training jobs themselves are billed per second while they run.
NAT_GATEWAY_HOUR = 0.045
INTERFACE_ENDPOINT_HOUR_PER_AZ = 0.01
KMS_KEY_MONTH = 1.0
FSX_GIB_MONTH = {("PERSISTENT_2", 125): 0.145, ("PERSISTENT_2", 250): 0.21, ("PERSISTENT_2", 500): 0.34,
                 ("PERSISTENT_2", 1000): 0.60, ("SCRATCH_2", None): 0.14}


def load_templates(cdk_out: Path) -> dict[str, dict]:
    manifest = json.loads((cdk_out / "manifest.json").read_text())
    return {name: json.loads((cdk_out / a["properties"]["templateFile"]).read_text())
            for name, a in manifest["artifacts"].items() if a.get("type") == "aws:cloudformation:stack"}


def cost_drivers(templates: dict[str, dict]) -> list[tuple[str, float]]:
    """(what, USD per month) for each always-on resource that costs money by the hour or GiB."""
    resources = [r for t in templates.values() for r in t.get("Resources", {}).values()]
    drivers: list[tuple[str, float]] = []
    for r in resources:
        if r["Type"] == "AWS::FSx::FileSystem":
            p = r["Properties"]
            lustre = p["LustreConfiguration"]
            tier = (lustre["DeploymentType"], lustre.get("PerUnitStorageThroughput"))
            price = FSX_GIB_MONTH[tier]
            drivers.append((f"FSx for Lustre {lustre['DeploymentType']} {p['StorageCapacity']} GiB "
                            f"({price}/GiB-month)", p["StorageCapacity"] * price))
    nats = sum(r["Type"] == "AWS::EC2::NatGateway" for r in resources)
    if nats:
        drivers.append((f"{nats} NAT gateway(s), before data processing", nats * NAT_GATEWAY_HOUR * HOURS_PER_MONTH))
    endpoint_azs = sum(len(r["Properties"].get("SubnetIds", [])) for r in resources
                       if r["Type"] == "AWS::EC2::VPCEndpoint" and r["Properties"].get("VpcEndpointType") == "Interface")
    if endpoint_azs:
        drivers.append((f"interface endpoints ({endpoint_azs} endpoint-AZs)",
                        endpoint_azs * INTERFACE_ENDPOINT_HOUR_PER_AZ * HOURS_PER_MONTH))
    keys = sum(r["Type"] == "AWS::KMS::Key" for r in resources)
    if keys:
        drivers.append((f"{keys} KMS key(s)", keys * KMS_KEY_MONTH))
    return drivers


def print_summary(cdk_out: Path, console: Console | None = None) -> float:
    console = console or Console()
    templates = load_templates(cdk_out)
    for name, template in templates.items():
        counts = Counter(r["Type"] for r in template.get("Resources", {}).values())
        table = Table(title=f"{name}: {sum(counts.values())} resources", title_justify="left")
        table.add_column("resource type")
        table.add_column("count", justify="right")
        for type_, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            table.add_row(type_, str(n))
        console.print(table)
    drivers = cost_drivers(templates)
    table = Table(title="Monthly cost of leaving it running (us-east-1 list prices; jobs billed separately)",
                  title_justify="left")
    table.add_column("cost driver")
    table.add_column("USD / month", justify="right")
    for what, usd in drivers:
        table.add_row(what, f"{usd:,.2f}")
    total = sum(usd for _, usd in drivers)
    table.add_row("[bold]total[/bold]", f"[bold]{total:,.2f}[/bold]")
    console.print(table)
    return total


if __name__ == "__main__":
    print_summary(Path(sys.argv[1] if len(sys.argv) > 1 else "cdk.out"))

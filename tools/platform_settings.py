"""Write examples/platform-settings.json from a synthesized cloud assembly.

The platform stack publishes its settings document (jobs.platform.PlatformSettings) as the `PlatformSettings`
stack output and SSM parameter. In a synthesized template its values are CloudFormation intrinsics (bucket
names, role and key ARNs, subnet ids are only known once deployed). This tool resolves them the way a deploy
would, with stand-ins for what only a deploy knows:
- the pseudo parameters: account 123456789012, region us-east-1, partition aws;
- an S3 bucket: `<name_prefix>-<construct name>-<account>-<region>` (a deploy gives CloudFormation's generated
  name; a readable, stable stand-in keeps the examples' dataset URIs legible);
- a role ARN: `arn:aws:iam::<account>:role/<name_prefix>-<construct name>`; a KMS key ARN with a UUID, subnet,
  security group and file system ids, and an FSx mount name, all derived from the resource's logical id (stable
  across synths of the same app);
- Fn::FindInMap (the image table by region) and Fn::Sub of pseudo parameters, exactly.
Anything else is an error, so the tool notices when the document changes shape.

    python -m tools.platform_settings --cdk-out cdk.out            # write examples/platform-settings.json
    python -m tools.platform_settings --cdk-out cdk.out --check    # exit 1 if the file is not current

`--check` (and the test that keeps the example current) ignores the source bundle's asset hash: it is the sha256 of
sourcedir.tar.gz, so every edit of training/ or contract/ changes it, while the document's shape does not change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "platform-settings.json"
ACCOUNT, REGION = "123456789012", "us-east-1"
PSEUDO = {"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com"}


ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")


class UnresolvedIntrinsic(ValueError):
    pass


def platform_template(cdk_out: Path) -> tuple[str, dict[str, Any]]:
    """(stack name, template) of the one stack with a PlatformSettings output."""
    manifest = json.loads((cdk_out / "manifest.json").read_text())
    found = []
    for name, artifact in manifest["artifacts"].items():
        if artifact.get("type") == "aws:cloudformation:stack":
            template = json.loads((cdk_out / artifact["properties"]["templateFile"]).read_text())
            if "PlatformSettings" in template.get("Outputs", {}):
                found.append((name, template))
    if len(found) != 1:
        raise SystemExit(f"{cdk_out}: expected one stack with a PlatformSettings output, found {len(found)}")
    return found[0]


def _digest(logical_id: str) -> str:
    return hashlib.sha256(logical_id.encode()).hexdigest()


def _construct_name(logical_id: str) -> str:
    """'DatasetsBucket9EEDBE5A' -> 'datasets', 'ExecutionRole829ADBFF' -> 'execution-role'."""
    base = re.sub(r"[0-9A-F]{8}$", "", logical_id).removesuffix("Bucket")
    return re.sub(r"(?<!^)(?=[A-Z])", "-", base).lower()


def stand_in(prefix: str, template: dict[str, Any], logical_id: str, attribute: str | None) -> str:
    """The value a deploy would give `Ref logical_id` (attribute None) or `Fn::GetAtt [logical_id, attribute]`."""
    kind = template["Resources"][logical_id]["Type"]
    digest, name = _digest(logical_id), _construct_name(logical_id)
    values = {
        ("AWS::S3::Bucket", None): f"{prefix}-{name}-{ACCOUNT}-{REGION}",
        ("AWS::IAM::Role", "Arn"): f"arn:aws:iam::{ACCOUNT}:role/{prefix}-{name}",
        ("AWS::KMS::Key", "Arn"): f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{uuid.UUID(digest[:32])}",
        ("AWS::EC2::Subnet", None): f"subnet-{digest[:17]}",
        ("AWS::EC2::SecurityGroup", "GroupId"): f"sg-{digest[:17]}",
        ("AWS::FSx::FileSystem", None): f"fs-{digest[:17]}",
        ("AWS::FSx::FileSystem", "LustreMountName"): "".join(c for c in digest if c.isalpha())[:8].ljust(8, "a"),
    }
    if (kind, attribute) not in values:
        raise UnresolvedIntrinsic(f"no stand-in for {kind} {logical_id} {attribute or 'Ref'}")
    return values[(kind, attribute)]


def resolve(value: Any, template: dict[str, Any], prefix: str) -> Any:
    if isinstance(value, list):
        return [resolve(v, template, prefix) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1 or not next(iter(value)).startswith(("Fn::", "Ref")):
        return {k: resolve(v, template, prefix) for k, v in value.items()}
    ((fn, arg),) = value.items()
    if fn == "Ref":
        return PSEUDO[arg] if arg in PSEUDO else stand_in(prefix, template, arg, None)
    if fn == "Fn::GetAtt":
        logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
        return stand_in(prefix, template, logical_id, attribute)
    if fn == "Fn::Join":
        separator, parts = arg
        return separator.join(str(resolve(p, template, prefix)) for p in parts)
    if fn == "Fn::FindInMap":
        mapping, first, second = (resolve(a, template, prefix) for a in arg)
        return template["Mappings"][mapping][first][second]
    if fn == "Fn::Sub" and isinstance(arg, str):
        def pseudo(match: re.Match) -> str:
            if match.group(1) not in PSEUDO:
                raise UnresolvedIntrinsic(f"Fn::Sub of ${{{match.group(1)}}}")
            return PSEUDO[match.group(1)]
        return re.sub(r"\$\{([^}]+)\}", pseudo, arg)
    raise UnresolvedIntrinsic(f"{fn} is not resolved by this tool")


def settings_document(cdk_out: Path) -> dict[str, Any]:
    """The platform settings document of the assembly, its intrinsics resolved with the stand-ins above."""
    stack_name, template = platform_template(cdk_out)
    prefix = stack_name.removesuffix("-platform")
    return json.loads(resolve(template["Outputs"]["PlatformSettings"]["Value"], template, prefix))


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def masked(text: str) -> str:
    """`text` with every 64-hex asset hash replaced by `<asset-hash>`."""
    return ASSET_HASH.sub("<asset-hash>", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cdk-out", type=Path, default=ROOT / "cdk.out", help="synthesized cloud assembly")
    parser.add_argument("--out", type=Path, default=EXAMPLE)
    parser.add_argument("--check", action="store_true", help="fail if --out is not what the assembly gives")
    args = parser.parse_args(argv)
    text = render(settings_document(args.cdk_out))
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if masked(current) != masked(text):
            print(f"{args.out} is not current: run python -m tools.platform_settings --cdk-out {args.cdk_out}",
                  file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

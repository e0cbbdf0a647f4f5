"""Synthesized policies as concrete documents, evaluated by a real IAM policy evaluator.

`resolve` turns a template's CloudFormation intrinsics into the values a deploy would give, with a fixed account,
region and partition and a readable stand-in for each resource's name (its logical id); `evaluate` runs a whole
matrix of requests through @cloud-copilot/iam-simulate (tests/infra/iam_simulate.mjs) in one node process.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

from tests.conftest import ROOT, offline_env

ACCOUNT, REGION, PARTITION = "123456789012", "us-east-1", "aws"
PSEUDO = {"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": PARTITION,
          "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "stack"}
SIMULATOR = ROOT / "tests" / "infra" / "iam_simulate.mjs"


class Templates:
    """The stacks of one synth, by name; resolves intrinsics, Fn::GetStackOutput across them included."""

    def __init__(self, templates: dict[str, dict]) -> None:
        self.templates = templates

    def resolve(self, value: Any, stack: str) -> Any:
        if isinstance(value, list):
            return [self.resolve(v, stack) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) != 1 or not next(iter(value)).startswith(("Fn::", "Ref")):
            return {k: self.resolve(v, stack) for k, v in value.items()}
        ((fn, arg),) = value.items()
        if fn == "Ref":
            return PSEUDO.get(arg) or self._stand_in(stack, arg, None)
        if fn == "Fn::GetAtt":
            logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            return self._stand_in(stack, logical_id, attribute)
        if fn == "Fn::Join":
            separator, parts = arg
            return separator.join(str(self.resolve(p, stack)) for p in parts)
        if fn == "Fn::Sub" and isinstance(arg, str):
            return re.sub(r"\$\{([^}]+)\}", lambda m: PSEUDO[m.group(1)], arg)
        if fn == "Fn::FindInMap":
            mapping, first, second = (self.resolve(a, stack) for a in arg)
            return self.templates[stack]["Mappings"][mapping][first][second]
        if fn == "Fn::GetStackOutput":
            other = arg["StackName"]
            return self.resolve(self.templates[other]["Outputs"][arg["OutputName"]]["Value"], other)
        raise ValueError(f"{fn} is not resolved here")

    def _stand_in(self, stack: str, logical_id: str, attribute: str | None) -> str:
        resource = self.templates[stack]["Resources"][logical_id]
        kind, props = resource["Type"], resource.get("Properties", {})
        name = logical_id.lower()
        region_account = f"{REGION}:{ACCOUNT}"
        values = {
            ("AWS::IAM::Role", None): logical_id,
            ("AWS::IAM::Role", "Arn"): f"arn:aws:iam::{ACCOUNT}:role{props.get('Path', '/')}{logical_id}",
            ("AWS::S3::Bucket", None): name,
            ("AWS::S3::Bucket", "Arn"): f"arn:aws:s3:::{name}",
            ("AWS::StepFunctions::StateMachine", None):
                f"arn:aws:states:{region_account}:stateMachine:{props.get('StateMachineName', logical_id)}",
            ("AWS::KMS::Key", "Arn"): f"arn:aws:kms:{region_account}:key/{name}",
            ("AWS::Lambda::Function", "Arn"): f"arn:aws:lambda:{region_account}:function:{logical_id}",
            # A version's Ref is its ARN: the function's, qualified by the version number.
            ("AWS::Lambda::Version", None): f"arn:aws:lambda:{region_account}:function:"
                                            f"{props.get('FunctionName', {}).get('Ref', logical_id)}:1",
            ("AWS::SNS::Topic", None): f"arn:aws:sns:{region_account}:{props.get('TopicName', logical_id)}",
            ("AWS::Logs::LogGroup", "Arn"): f"arn:aws:logs:{region_account}:log-group:{logical_id}:*",
            ("AWS::DynamoDB::Table", "Arn"): f"arn:aws:dynamodb:{region_account}:table/"
                                             f"{props.get('TableName', logical_id)}",
        }
        return values.get((kind, attribute), f"{logical_id}.{attribute}" if attribute else logical_id)

    def find(self, stack: str, type_: str, logical_prefix: str) -> str:
        """The one resource of `type_` whose logical id is `logical_prefix` + the CDK's 8-character hash."""
        found = [k for k, r in self.templates[stack]["Resources"].items()
                 if r["Type"] == type_ and re.fullmatch(f"{logical_prefix}[0-9A-F]{{8}}", k)]
        assert len(found) == 1, (stack, type_, logical_prefix, found)
        return found[0]

    def role_policies(self, stack: str, role: str) -> list[dict]:
        """Every identity policy document attached to role `role` (inline policies and AWS::IAM::Policy)."""
        docs = [p["PolicyDocument"] for p in self.templates[stack]["Resources"][role]["Properties"].get("Policies", [])]
        for r in self.templates[stack]["Resources"].values():
            if r["Type"] == "AWS::IAM::Policy" and {"Ref": role} in r["Properties"]["Roles"]:
                docs.append(r["Properties"]["PolicyDocument"])
        return [self.resolve(d, stack) for d in docs]

    def role_arn(self, stack: str, role: str) -> str:
        return self._stand_in(stack, role, "Arn")

    def managed_policy(self, stack: str, logical_id: str) -> dict:
        return self.resolve(self.templates[stack]["Resources"][logical_id]["Properties"]["PolicyDocument"], stack)

    def resource_policy(self, stack: str, logical_id: str, key: str) -> dict:
        return self.resolve(self.templates[stack]["Resources"][logical_id]["Properties"][key], stack)


@dataclass
class Matrix:
    """Requests to evaluate together; `expect` is "Allowed" or "denied" (implicitly or explicitly)."""

    requests: list[dict] = field(default_factory=list)
    expected: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, *, principal: str, policies: list[dict], action: str, resource: str, expect: str,
            context: dict[str, Any] | None = None, resource_policy: dict | None = None,
            endpoint_policy: dict | None = None) -> None:
        assert name not in self.expected, name
        # The evaluator does not derive the principal's global keys from the request: they are given here.
        context = {"aws:PrincipalArn": principal, "aws:PrincipalAccount": ACCOUNT, **(context or {})}
        self.requests.append({"name": name, "principal": principal, "identityPolicies": policies, "action": action,
                              "resource": resource, "account": ACCOUNT, "context": context,
                              **({"resourcePolicy": resource_policy} if resource_policy else {}),
                              **({"endpointPolicy": endpoint_policy} if endpoint_policy else {})})
        self.expected[name] = expect

    def evaluate(self) -> dict[str, str]:
        return evaluate(self.requests)


def evaluate(requests: list[dict]) -> dict[str, str]:
    """{name: "Allowed" | "ImplicitlyDenied" | "ExplicitlyDenied"} for every request, in one node process."""
    node = ROOT / "node_modules" / ".bin" / "node"
    result = subprocess.run([str(node), str(SIMULATOR)], input=json.dumps(requests), capture_output=True,
                            text=True, cwd=ROOT, env=offline_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)

"""Acknowledging cdk-nag findings (cdk-nag 3 reads CDK's own Validations acknowledgements).

Every acknowledgement names the exact finding (rule and, for IAM5, the action or resource) and says why.
"""

from __future__ import annotations

import re

import aws_cdk as cdk
from constructs import IConstruct

PACKS = ("AwsSolutions", "NIST.800.53.R5")


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge `rule` (e.g. "AwsSolutions-IAM5[Action::s3:List*]") on scope and the resources under it."""
    pack = next(p for p in PACKS if rule.startswith(p))
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"{pack}::{rule}", reason=reason))


def logical_id(resource: IConstruct) -> str:
    """The CloudFormation logical id of an L2's resource, as cdk-nag prints it inside <...> in IAM5 findings."""
    stack = cdk.Stack.of(resource)
    child = resource.node.default_child if resource.node.default_child is not None else resource
    return stack.resolve(stack.get_logical_id(child))


def nag_form(scope: IConstruct, value: str) -> str:
    """A token-bearing string as cdk-nag prints it in a finding id: Refs as <Name>, GetAtts as <Name.Attr>."""
    resolved = cdk.Stack.of(scope).resolve(value)
    if isinstance(resolved, dict) and "Fn::Join" in resolved:
        separator, parts = resolved["Fn::Join"]
        if separator != "":  # a real check: `python -O` drops asserts, and a wrong id would suppress nothing
            raise ValueError(f"cannot name {resolved} the way cdk-nag does (a join with separator {separator!r})")
    else:
        parts = [resolved]
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif "Ref" in part:
            out.append(f"<{part['Ref']}>")
        elif "Fn::GetAtt" in part:
            out.append(f"<{'.'.join(part['Fn::GetAtt'])}>")
        elif isinstance(part.get("Fn::Sub"), str):
            out.append(re.sub(r"\$\{([^}]+)\}", r"<\1>", part["Fn::Sub"]))
        else:
            raise ValueError(f"cannot name {part} the way cdk-nag does")
    return "".join(out)

"""The launcher's state machine definition, taken from a synthesized template with its intrinsics resolved.

The template's DefinitionString is an Fn::Join over strings, Refs and GetAtts (the Lambda ARNs, the topic,
the partition). `resolve` replaces each with a concrete fake value, the same way CloudFormation would;
anything else (Fn::Sub, Fn::ImportValue, ...) is an error, so a test notices when the template changes shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ACCOUNT = "123456789012"
REGION = "us-east-1"
PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::URLSuffix": "amazonaws.com",
}


class UnresolvedIntrinsic(ValueError):
    pass


def resolve(value: Any, refs: dict[str, str], attrs: dict[tuple[str, str], str]) -> Any:
    """Resolve Fn::Join, Ref and Fn::GetAtt in a template value; raise on any other intrinsic."""
    if isinstance(value, list):
        return [resolve(v, refs, attrs) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Ref":
            if arg in PSEUDO:
                return PSEUDO[arg]
            if arg not in refs:
                raise UnresolvedIntrinsic(f"Ref to {arg!r}: no fake value for it")
            return refs[arg]
        if fn == "Fn::GetAtt":
            key = (arg[0], arg[1]) if isinstance(arg, list) else tuple(arg.split(".", 1))
            if key not in attrs:
                raise UnresolvedIntrinsic(f"Fn::GetAtt {key}: no fake value for it")
            return attrs[key]
        if fn == "Fn::Join":
            sep, parts = arg
            return sep.join(str(resolve(p, refs, attrs)) for p in parts)
        if fn.startswith("Fn::") or fn == "Condition":
            raise UnresolvedIntrinsic(f"{fn} is not resolved by this test harness")
    return {k: resolve(v, refs, attrs) for k, v in value.items()}


def contains_intrinsic(value: Any) -> bool:
    if isinstance(value, list):
        return any(contains_intrinsic(v) for v in value)
    if isinstance(value, dict):
        return any(k == "Ref" or k.startswith("Fn::") for k in value) or any(
            contains_intrinsic(v) for v in value.values()
        )
    return False


@dataclass(frozen=True)
class LauncherDefinition:
    definition: dict[str, Any]
    # Fake function ARN -> the function's Handler property ("jobs.handler.prepare").
    handlers: dict[str, str]
    topic_name: str
    topic_arn: str
    # The run registry's table as the template declares it (TableName, KeySchema, AttributeDefinitions, ...).
    table: dict[str, Any]
    # The EventBridge rules on the state machine's executions: (pattern with its Refs resolved, target handlers).
    execution_rules: list[tuple[dict[str, Any], list[str]]]
    state_machine_arn: str = ""


def fake_names(template: dict) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """Concrete Ref and Arn values for the resources the definition can name."""
    refs: dict[str, str] = {}
    attrs: dict[tuple[str, str], str] = {}
    for logical_id, resource in template["Resources"].items():
        kind = resource["Type"]
        props = resource.get("Properties", {})
        if kind == "AWS::Lambda::Function":
            arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{logical_id}"
            refs[logical_id] = logical_id
            attrs[(logical_id, "Arn")] = arn
        elif kind == "AWS::Lambda::Version":  # its Ref is the function's ARN qualified by the version number
            refs[logical_id] = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{props['FunctionName']['Ref']}:1"
        elif kind == "AWS::SNS::Topic":
            name = props.get("TopicName", logical_id)
            refs[logical_id] = f"arn:aws:sns:{REGION}:{ACCOUNT}:{name}"
            attrs[(logical_id, "TopicName")] = name
        elif kind == "AWS::IAM::Role":
            refs[logical_id] = logical_id
            attrs[(logical_id, "Arn")] = f"arn:aws:iam::{ACCOUNT}:role/{logical_id}"
        elif kind == "AWS::StepFunctions::StateMachine":
            refs[logical_id] = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{props['StateMachineName']}"
        elif kind == "AWS::DynamoDB::Table":
            refs[logical_id] = props["TableName"]
        elif kind == "AWS::Logs::LogGroup":
            name = props.get("LogGroupName", logical_id)
            refs[logical_id] = name
            attrs[(logical_id, "Arn")] = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}:*"
    return refs, attrs


def launcher_definition(template: dict) -> LauncherDefinition:
    """The (single) state machine of the launcher template, resolved, with its Lambda handlers and topic."""
    machines = [r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    assert len(machines) == 1, f"expected one state machine in the launcher template, found {len(machines)}"
    refs, attrs = fake_names(template)
    definition = json.loads(resolve(machines[0]["Properties"]["DefinitionString"], refs, attrs))
    resources = template["Resources"]
    handlers = {
        attrs[(logical_id, "Arn")]: r["Properties"]["Handler"]
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::Lambda::Function"
    }
    # The definition invokes each function's version of the deploy (platform_constructs.launcher_functions).
    handlers |= {
        refs[logical_id]: resources[r["Properties"]["FunctionName"]["Ref"]]["Properties"]["Handler"]
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::Lambda::Version"
    }
    topics = [(lid, r) for lid, r in template["Resources"].items() if r["Type"] == "AWS::SNS::Topic"]
    assert len(topics) == 1, "expected one notification topic"
    topic_id, _ = topics[0]
    (table,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::DynamoDB::Table"]
    rules = []
    for rule in (r["Properties"] for r in resources.values() if r["Type"] == "AWS::Events::Rule"):
        pattern = resolve(rule["EventPattern"], refs, attrs)
        if pattern.get("source") == ["aws.states"]:
            targets = [handlers[resolve(t["Arn"], refs, attrs)] for t in rule["Targets"]]
            rules.append((pattern, targets))
    return LauncherDefinition(
        definition=definition,
        handlers=handlers,
        topic_name=attrs[(topic_id, "TopicName")],
        topic_arn=refs[topic_id],
        table={k: v for k, v in table.items() if k in TABLE_PROPERTIES},
        execution_rules=rules,
        state_machine_arn=refs[next(lid for lid, r in resources.items()
                                    if r["Type"] == "AWS::StepFunctions::StateMachine")],
    )


# What CreateTable takes of the template's table (the rest: encryption, recovery, protection, tags).
TABLE_PROPERTIES = ("TableName", "KeySchema", "AttributeDefinitions", "BillingMode", "GlobalSecondaryIndexes")

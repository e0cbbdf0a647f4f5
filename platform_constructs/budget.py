"""A team's monthly cost budget: AWS Budgets on the cost of the jobs tagged with the team's cost allocation tag,
telling the team's run-notifications topic when the month's actual cost passes 80% and its forecast 100%.

The tag (`<name_prefix>:team`, platform_constructs.teams.team_tags) is on every job the team's launcher renders
(jobs.render.training_job, PlatformSettings.job_tags). AWS Budgets filters on it only once the platform team has activated it
as a cost allocation tag in the Billing console (an account-level step no stack can take; docs/SECURITY.md);
until then the budget sees no cost. A budget watches, it does not stop jobs: each run's own cost is in its
summary and `trainctl runs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import Aws
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from constructs import Construct

# (notification type, percent of the limit) at which the team hears.
THRESHOLDS = (("ACTUAL", 80), ("FORECASTED", 100))
BUDGETS_SERVICE = "budgets.amazonaws.com"


def cost_filter(tags: Mapping[str, str]) -> list[str]:
    """AWS Budgets' TagKeyValue filter values for user-defined cost allocation tags: `user:<key>$<value>`."""
    return [f"user:{key}${value}" for key, value in tags.items()]


@dataclass(frozen=True, kw_only=True)
class TeamBudgetProps:
    name_prefix: str
    """The team's prefix: the budget is named `<name_prefix>-training-monthly`."""
    monthly_usd: float
    """The monthly cost limit, in USD, that the thresholds (THRESHOLDS) are percentages of."""
    tags: Mapping[str, str]
    """The team's cost allocation tag(s) (platform_constructs.teams.team_tags): the budget counts the cost of the
    jobs that carry them. Must not be empty."""
    topic: sns.ITopic
    """The team's run-notifications topic, told at each threshold; the budget adds AWS Budgets to its policy."""

    def __post_init__(self) -> None:
        if not self.tags:
            raise ValueError(f"{self.name_prefix}: a budget needs the team's cost allocation tag to filter its jobs on")


class TeamBudget(Construct):
    """A team's monthly cost budget on its tagged jobs (this module's docstring: what it watches, what it does not)."""

    def __init__(self, scope: Construct, id: str, props: TeamBudgetProps) -> None:
        super().__init__(scope, id)
        topic = props.topic
        # AWS Budgets publishes to the topic as its service principal, for this account's budgets only (the key
        # policy lets it encrypt for the topic: platform_constructs.encryption).
        topic.add_to_resource_policy(iam.PolicyStatement(
            sid="BudgetsPublish", principals=[iam.ServicePrincipal(BUDGETS_SERVICE)], actions=["sns:Publish"],
            resources=[topic.topic_arn],
            conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                        "ArnLike": {"aws:SourceArn": f"arn:{Aws.PARTITION}:budgets::{Aws.ACCOUNT_ID}:*"}}))
        self.budget = budgets.CfnBudget(
            self, "Budget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_name=f"{props.name_prefix}-training-monthly",
                budget_type="COST",
                time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=props.monthly_usd, unit="USD"),
                cost_filters={"TagKeyValue": cost_filter(props.tags)},
            ),
            notifications_with_subscribers=[
                budgets.CfnBudget.NotificationWithSubscribersProperty(
                    notification=budgets.CfnBudget.NotificationProperty(
                        notification_type=kind, comparison_operator="GREATER_THAN", threshold=percent,
                        threshold_type="PERCENTAGE"),
                    subscribers=[budgets.CfnBudget.SubscriberProperty(subscription_type="SNS",
                                                                      address=topic.topic_arn)])
                for kind, percent in THRESHOLDS
            ],
        )

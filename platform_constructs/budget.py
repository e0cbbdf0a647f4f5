"""A team's monthly cost budget: AWS Budgets on the cost of the jobs tagged with the team's cost allocation tag,
telling the team's run-notifications topic when the month's actual cost passes 80% and its forecast 100%.

The tag (`<name_prefix>:team`, platform_constructs.teams.team_tags) is on every job the team's launcher renders
(jobs.render.training_job, PlatformSettings.job_tags). AWS Budgets filters on it only once the platform team has activated it
as a cost allocation tag in the Billing console (an account-level step no stack can take; docs/SECURITY.md);
until then the budget sees no cost. A budget watches, it does not stop jobs: each run's own cost is in its
summary and `trainctl runs`.
"""

from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from constructs import Construct

# (notification type, percent of the limit) at which the team hears.
THRESHOLDS = (("ACTUAL", 80), ("FORECASTED", 100))
BUDGETS_SERVICE = "budgets.amazonaws.com"


def cost_filter(tags: dict[str, str]) -> list[str]:
    """AWS Budgets' TagKeyValue filter values for user-defined cost allocation tags: `user:<key>$<value>`."""
    return [f"user:{key}${value}" for key, value in tags.items()]


class TeamBudget(Construct):
    def __init__(self, scope: Construct, id: str, *, name_prefix: str, monthly_usd: float, tags: dict[str, str],
                 topic: sns.ITopic) -> None:
        super().__init__(scope, id)
        if not tags:
            raise ValueError(f"{name_prefix}: a budget needs the team's cost allocation tag to filter its jobs on")
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
                budget_name=f"{name_prefix}-training-monthly",
                budget_type="COST",
                time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=monthly_usd, unit="USD"),
                cost_filters={"TagKeyValue": cost_filter(tags)},
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

"""What SageMaker training costs per instance-hour, as the AWS Price List API answers it: which products and
rates count. trainctl (cli.price_source: plan, show, runs) and the launcher's Summarize (the run record's cost) read
the API's answer through this one module.

The AWS Price List API, as this module reads it (sources, read 2026):
  - GetProducts takes ServiceCode, Filters ({Type: TERM_MATCH, Field: an attribute name, Value}), FormatVersion
    ("aws_v1"), MaxResults and NextToken, and returns `PriceList`, "the list of products that match your
    filters ... both the product metadata and the price information", each a JSON *string*; it pages with
    NextToken (the get_products paginator) and fails with AccessDeniedException among others: the pricing
    2017-10-15 service model shipped in botocore (botocore/data/pricing/2017-10-15/service-2.json and
    paginators-1.json), the same text as the SDK references (e.g. docs.aws.amazon.com/AWSJavaSDK/latest/javadoc/
    com/amazonaws/services/pricing/model/GetProductsResult.html: "List<String> getPriceList()"). The API has a
    few endpoints, https://api.pricing.us-east-1.amazonaws.com among them (the service's documentation, e.g.
    docs.rs/aws-sdk-pricing); the region priced is a filter, not the endpoint.
  - a product: {"product": {"productFamily", "attributes": {...}}, "terms": {"OnDemand": {<sku.offerTermCode>:
    {"priceDimensions": {<rateCode>: {"unit", "pricePerUnit": {"USD": "<decimal string>"}, ...}}}}}}: the AWS
    Billing user guide, "Reading the service price list file for an AWS service" (https://docs.aws.amazon.com/
    awsaccountbilling/latest/aboutv2/reading-service-price-list-file-for-services.html, its term definitions).
  - AmazonSageMaker's attribute names are not listed per service there (GetServices / `aws pricing
    describe-services --service-code AmazonSageMaker` lists them). We use `regionCode` ("us-east-1"), `component`
    ("Training"; others are "Hosting", "Notebook", "Processing", "studio-jupyterlab", ...), `instanceName`
    ("ml.g5.2xlarge", with the "ml." prefix) and `usagetype` ("USE1-Train:ml.m4.16xlarge"), and hourly rates of
    unit "Hrs", as public code reading the AmazonSageMaker offer does: github.com/vantage-sh/ec2instances.info,
    sagemaker.py (the offer file: productFamily "ML Instance", regionCode, usagetype "USE1-Train:<type>", OnDemand
    priceDimensions pricePerUnit USD), and several projects that filter GetProducts on ServiceCode AmazonSageMaker
    with TERM_MATCH regionCode and component ("Training", "Hosting", "Processing") and read instanceName and the
    "Hrs" dimension (found through a code search; one notes that a type also has a
    "USE1-TrainingPlanUpfrontFee:<type>" product with unit "Quantity" and no component: a fee, not an hourly
    rate). An attribute AWS renames shows here as "no training products" for the region, never as a wrong price.
So a price is taken only from a product whose component is Training, in the run's region, for a type of the
catalog, from an OnDemand dimension whose unit is "Hrs" and whose USD figure is a price (`usd_per_hour`). Several
such products for one type (usage types) that agree give that price; if they disagree, the type is left unknown
and the plan says so (price_conflict), rather than guess which one a training job is billed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

SERVICE_CODE = "AmazonSageMaker"
COMPONENT = "Training"
HOURLY_UNIT = "Hrs"
API_REGION = "us-east-1"  # the Price List API's endpoint; the region priced is the regionCode filter
PAGE_SIZE = 100
# The month AWS prices hourly resources by (730 hours: 8,760 a year over 12), for monthly figures from hourly ones.
HOURS_PER_MONTH = 730
# What a price is, wherever one is read (the API's answer, a --prices file, trainctl's cache, the planner's table,
# the run record's cost): a positive, finite number of USD per instance-hour. A free-tier 0.00, a negative or NaN
# figure is no price: the type's cost is unknown, never zero or a guess.
PRICE_RULE = "must be a positive number of USD per hour"  # NaN and infinity are no numbers here


def usd_per_hour(value: Any) -> float | None:
    """`value` as a price when it is one (a number that PRICE_RULE allows), else None. Booleans and strings are no
    numbers here (JSON's true, a "3.5" in a file); the API's decimal strings are parsed by `_api_usd` first."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def priced(prices: Mapping[str, Any] | None, instance_type: str) -> float | None:
    """The type's price from a table; None when the table has none for it, or holds something that is no price."""
    return usd_per_hour((prices or {}).get(instance_type))


def cluster_usd_per_hour(cluster: Iterable[tuple[int, str]], prices: Mapping[str, Any] | None) -> float | None:
    """What a cluster of (count, instance type) costs an hour at `prices`; None when a type of it has no price."""
    rates = [(count, priced(prices, kind)) for count, kind in cluster]
    if any(rate is None for _, rate in rates):
        return None
    return sum(count * rate for count, rate in rates)


def instance_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    """One type's training products in the region: the launcher prices only the types its run used."""
    return [*api_filters(region), {"Type": "TERM_MATCH", "Field": "instanceName", "Value": instance_type}]


def api_filters(region: str) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "TERM_MATCH", "Field": "component", "Value": COMPONENT}]


def products_to_prices(entries: Iterable[Any], region: str) -> tuple[dict[str, float], dict[str, str], int]:
    """(prices, unresolved, unreadable entries) from GetProducts' PriceList (JSON strings, or parsed products)."""
    from jobs.catalog import CATALOG

    offers: dict[str, dict[float, set[str]]] = {}
    skipped = 0
    for entry in entries:
        try:
            doc = json.loads(entry) if isinstance(entry, str | bytes) else entry
            product = doc["product"]
            attributes = product["attributes"]
        except (ValueError, TypeError, KeyError):
            skipped += 1
            continue
        name = attributes.get("instanceName")
        if (str(attributes.get("component", "")).lower() != COMPONENT.lower()
                or attributes.get("regionCode") != region or name not in CATALOG):
            continue
        usage = str(attributes.get("usagetype") or product.get("sku") or "?")
        for term in ((doc.get("terms") or {}).get("OnDemand") or {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                usd = _api_usd((dimension.get("pricePerUnit") or {}).get("USD"))
                if str(dimension.get("unit", "")).lower() == HOURLY_UNIT.lower() and usd is not None:
                    offers.setdefault(name, {}).setdefault(usd, set()).add(usage)
    prices: dict[str, float] = {}
    unresolved: dict[str, str] = {}
    for name, by_price in sorted(offers.items()):
        if len(by_price) == 1:
            prices[name] = next(iter(by_price))
        else:
            found = "; ".join(f"${price:g}/h: {', '.join(sorted(usages))}" for price, usages in sorted(by_price.items()))
            unresolved[name] = (f"the AWS Price List API gives {len(by_price)} different on-demand training prices "
                                f"per hour ({found}): left unknown rather than guess which one a job is billed")
    return prices, unresolved, skipped


def _api_usd(value: Any) -> float | None:
    """A price from the API's decimal string ("32.7726"); anything else (a free-tier "0.0000000000") is no price."""
    try:
        usd = float(value) if isinstance(value, str) else value
    except ValueError:
        return None
    return usd_per_hour(usd)

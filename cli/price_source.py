"""Where `trainctl plan` gets its prices: on-demand SageMaker training USD per instance-hour, by instance type.

    --prices auto        the AWS Price List API when AWS credentials are found (the default); offline, or when the
                         API cannot be asked, the last answer this machine cached, however old (the plan says its
                         date); else none
    --prices aws         the AWS Price List API, asked again now (an error says what failed and how to fix it)
    --prices none        no prices: every cost is "price unknown"
    --prices FILE.json   {"ml.p4d.24xlarge": <USD per hour>, ...}: positive numbers, instance types of the catalog

The planner (jobs.planning.plan_request) takes the table as an input; nothing in jobs/ talks to AWS or keeps a
price. The API's answer is cached per region in ~/.cache/trainctl/prices-<region>.json ($XDG_CACHE_HOME/trainctl
when set), with the time it was fetched; `auto` reuses it for CACHE_DAYS, `aws` always asks again. The plan
(table, --json `prices`, chart) says which source it used and its date.

How the Price List API's answer is read (which products, which rates) is jobs.prices, shared with the
launcher's run record.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.cache_files import cache_file, replace_file
from cli.errors import UserError
from jobs.prices import (
    API_REGION,
    COMPONENT,
    PAGE_SIZE,
    PRICE_RULE,
    SERVICE_CODE,
    api_filters,
    products_to_prices,
    usd_per_hour,
)
from jobs.timestamps import utc_datetime

CACHE_DAYS = 7
CHOICES = ("auto", "aws", "none")
FILE_EXAMPLE = '{"ml.p4d.24xlarge": <USD per hour>, ...}'
OTHER_SOURCES = f"or give prices in a file (--prices FILE.json, e.g. {FILE_EXAMPLE}), or plan without (--prices none)"
_ACCESS_DENIED = {"AccessDenied", "AccessDeniedException"}
_CREDENTIALS_REFUSED = {"UnrecognizedClientException", "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException",
                        "InvalidSignatureException", "SignatureDoesNotMatch"}
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")


@dataclass(frozen=True)
class PriceTable:
    """The prices a plan uses, and where they came from."""

    source: str  # "aws", "file" or "none"
    prices: dict[str, float] = field(default_factory=dict)
    region: str | None = None
    date: dt.datetime | None = None  # aws: when the API answered; file: when the file was last modified
    path: str | None = None  # file: the file read; aws: the cache file
    cached: bool = False  # aws: read from the cache, not asked now
    reason: str = ""  # none: why there are no prices
    unresolved: dict[str, str] = field(default_factory=dict)  # instance type -> why it is left unknown
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: the source and its date."""
        day = f"{self.date:%Y-%m-%d}" if self.date else None
        if self.source == "aws":
            text = (f"AWS Price List API ({SERVICE_CODE}, component {COMPONENT}, on demand, {self.region}), "
                    f"fetched {day}")
            return text + (f" (cached in {self.path})" if self.cached else "")
        if self.source == "file":
            return f"file {self.path} (modified {day})"
        return f"none: {self.reason}" if self.reason else "none"

    def short(self) -> str:
        """A few words, for a chart."""
        day = f"{self.date:%Y-%m-%d}" if self.date else ""
        if self.source == "aws":
            return f"AWS Price List API, {self.region}, {day}"
        if self.source == "file":
            return f"{Path(self.path or '').name}, {day}"
        return "none"

    def warnings(self) -> list[tuple[str, str]]:
        """(code, message) for what the user should know about these prices."""
        out = [("price_conflict", f"{name}: {why}") for name, why in sorted(self.unresolved.items())]
        return out + [("prices", note) for note in self.notes]

    def to_dict(self, instance_types: Iterable[str] = ()) -> dict[str, Any]:
        """The `prices` field of `trainctl plan --json`; `usd_per_hour` for the plan's instance types."""
        return {
            "source": self.source, "description": self.describe(), "region": self.region,
            "date": self.date.isoformat().replace("+00:00", "Z") if self.date else None,
            "file": self.path if self.source == "file" else None, "cached": self.cached,
            "reason": self.reason or None,
            "usd_per_hour": {t: self.prices.get(t) for t in dict.fromkeys(instance_types)},
            "unresolved": dict(sorted(self.unresolved.items())), "notes": list(self.notes),
        }


class PricesUnavailable(Exception):
    """The API could not be asked, or answered nothing usable: what failed, and how to fix it."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


# ---- the choice -----------------------------------------------------------------------------------------


def resolve_prices(option: str, region: str | None, aws: Any, now: dt.datetime | None = None) -> PriceTable:
    """The table `--prices OPTION` names, for the run's `region`; `aws` is the command's cli.aws.Aws."""
    now = now or dt.datetime.now(dt.UTC)
    choice = option.strip()
    if choice == "none":
        return PriceTable("none", reason="--prices none")
    if choice == "aws":
        try:
            return aws_prices(region, aws.session, now, refresh=True)
        except PricesUnavailable as exc:
            raise UserError(f"--prices aws: {exc.message}", exc.hint) from None
    if choice == "auto":
        return auto_prices(region, aws, now)
    return load_price_file(Path(choice), option)


def auto_prices(region: str | None, aws: Any, now: dt.datetime) -> PriceTable:
    """The API when credentials are found (a fresh cache spares the call), else none. A failed call does not fail
    the plan: it plans without prices and says why."""
    from botocore.exceptions import BotoCoreError

    try:
        session = aws.session
        credentials = session.get_credentials()
    except BotoCoreError as exc:  # e.g. AWS_PROFILE names no profile
        return offline_prices(region, now, why=f"AWS credentials could not be read ({exc})") or PriceTable(
            "none", reason=f"AWS credentials could not be read ({exc}); --prices auto plans without prices")
    if credentials is None:
        return offline_prices(region, now) or PriceTable(
            "none", reason="no AWS credentials found, so --prices auto plans without prices (give credentials for "
                           "the AWS Price List API, or --prices FILE.json)")
    try:
        return aws_prices(region, session, now, refresh=False)
    except PricesUnavailable as exc:
        return offline_prices(region, now, why=exc.message) or PriceTable(
            "none", reason=f"the AWS Price List API could not be used: {exc.message}",
            notes=(f"to get prices: {exc.hint}",))


def offline_prices(region: str | None, now: dt.datetime, why: str = "no AWS credentials found") -> PriceTable | None:
    """The last answer this machine cached for the region, however old, when the API cannot be asked now (offline,
    no credentials): the plan prices with it and says how old it is. None when there is none."""
    cached = read_cache(region, now, max_age=None) if region else None
    if cached is None:
        return None
    days = (now - cached.date).days
    return dataclasses.replace(cached, notes=(*cached.notes, (
        f"{why}: the AWS prices this machine fetched on {cached.date:%Y-%m-%d} ({days} day{'s' * (days != 1)} ago), "
        "its last; --prices aws asks again once it can")))


# ---- the AWS Price List API -------------------------------------------------------------------------------


def pricing_client(session: Any) -> Any:
    """The Price List API client (its endpoint region; short timeouts: a plan should not hang on the network)."""
    from botocore.config import Config

    config = Config(connect_timeout=5, read_timeout=30, retries={"mode": "standard", "max_attempts": 3},
                    user_agent_extra="trainctl")
    return session.client("pricing", region_name=API_REGION, config=config)


def aws_prices(region: str | None, session: Any, now: dt.datetime, refresh: bool) -> PriceTable:
    """From the cache when it is fresh and `refresh` is False, else from the API (then cached)."""
    if not region:
        raise PricesUnavailable("the run has no region to price", "give the platform settings a region")
    if not refresh:
        cached = read_cache(region, now)
        if cached is not None:
            return cached
    table = fetch_aws_prices(session, region, now)
    note = write_cache(table)
    return table if note is None else dataclasses.replace(table, notes=(*table.notes, note))


def fetch_aws_prices(session: Any, region: str, now: dt.datetime) -> PriceTable:
    """Ask GetProducts for the region's SageMaker training products, every page."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    where = f"the AWS Price List API ({API_REGION})"
    try:
        pages = pricing_client(session).get_paginator("get_products").paginate(
            ServiceCode=SERVICE_CODE, Filters=api_filters(region), FormatVersion="aws_v1",
            PaginationConfig={"PageSize": PAGE_SIZE})
        entries = [entry for page in pages for entry in page.get("PriceList", [])]
    except (NoCredentialsError, PartialCredentialsError):
        raise PricesUnavailable(f"no AWS credentials found to call {where}",
                                "configure credentials (aws configure, AWS_PROFILE, or aws sso login), "
                                + OTHER_SOURCES) from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "Error"), error.get("Message", "")
        if code in _ACCESS_DENIED:
            raise PricesUnavailable(f"access denied to pricing:GetProducts ({where}): {message}",
                                    "allow the IAM action pricing:GetProducts to your user or role, "
                                    + OTHER_SOURCES) from None
        if code in _CREDENTIALS_REFUSED:
            raise PricesUnavailable(f"{where} refused your AWS credentials ({code}: {message})",
                                    "refresh them (aws sso login, or new keys), " + OTHER_SOURCES) from None
        raise PricesUnavailable(f"pricing:GetProducts failed ({code}: {message})",
                                "try again later, " + OTHER_SOURCES) from None
    except (ConnectionError, HTTPClientError) as exc:
        raise PricesUnavailable(f"cannot reach {where}: {exc}",
                                "check the network connection (and any proxy), " + OTHER_SOURCES) from None
    except BotoCoreError as exc:  # SSO token expired, credential process failed, ...
        raise PricesUnavailable(f"{where} could not be called: {exc}",
                                "check your AWS credentials, " + OTHER_SOURCES) from None
    if not entries:
        raise PricesUnavailable(f"{where} has no {SERVICE_CODE} {COMPONENT} products for region {region}",
                                "check the platform's region, " + OTHER_SOURCES)
    prices, unresolved, skipped = products_to_prices(entries, region)
    notes = (f"{skipped} Price List entries could not be read as products and were left out",) if skipped else ()
    return PriceTable("aws", prices, region=region, date=now, unresolved=unresolved, notes=notes)


# ---- the cache --------------------------------------------------------------------------------------------


def cache_path(region: str) -> Path:
    return cache_file(f"prices-{region}.json")


def read_cache(region: str, now: dt.datetime, max_age: dt.timedelta | None = dt.timedelta(days=CACHE_DAYS)
               ) -> PriceTable | None:
    """The cached answer for the region when it is younger than `max_age` (CACHE_DAYS; None: any age); None when
    absent, old or unreadable."""
    if not _REGION.fullmatch(region):
        return None
    path = cache_path(region)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        fetched = utc_datetime(doc["fetched"])
        prices = {str(k): usd_per_hour(v) for k, v in doc["usd_per_hour"].items()}
        unresolved = {str(k): str(v) for k, v in doc.get("unresolved", {}).items()}
        if doc.get("region") != region or doc.get("service_code") != SERVICE_CODE:
            return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if now - fetched < dt.timedelta(0) or (max_age is not None and now - fetched > max_age):
        return None
    if None in prices.values():  # a file edited by hand or cut short: ask the API again
        return None
    return PriceTable("aws", prices, region=region, date=fetched, path=str(path), cached=True, unresolved=unresolved)


def write_cache(table: PriceTable) -> str | None:
    """Keep the API's answer; returns a note when it cannot be written (the plan goes on without the cache)."""
    if not table.region or not _REGION.fullmatch(table.region):
        return None
    path = cache_path(table.region)
    doc = {"source": "AWS Price List API", "service_code": SERVICE_CODE, "filters": api_filters(table.region),
           "region": table.region, "fetched": table.date.isoformat().replace("+00:00", "Z"),
           "usd_per_hour": table.prices, "unresolved": table.unresolved}
    try:
        replace_file(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        return f"the prices could not be cached in {path} ({exc}): the next plan asks the API again"
    return None


# ---- a file -----------------------------------------------------------------------------------------------


def load_price_file(path: Path, option: str | None = None) -> PriceTable:
    """{"ml.p4d.24xlarge": <USD per hour>, ...}: every key a catalog instance type, every value a positive number."""
    from cli.request_file import read_json_object
    from jobs.catalog import CATALOG

    if not path.exists() and path.suffix.lower() != ".json":
        raise UserError(f"--prices {option or path}: not one of {', '.join(CHOICES)}, and no such file",
                        f"use --prices auto, aws or none, or a JSON file of prices, e.g. {FILE_EXAMPLE}")
    data = read_json_object(path, "price table")
    prices: dict[str, float] = {}
    for key, value in data.items():
        if key not in CATALOG:
            close = difflib.get_close_matches(key if key.startswith("ml.") else f"ml.{key}", list(CATALOG), n=1,
                                              cutoff=0.8)
            raise UserError(f"--prices {path}: {key!r} is not an instance type of the catalog"
                            + (f"; did you mean {close[0]!r}?" if close else ""),
                            "keys are SageMaker instance types such as ml.p4d.24xlarge (trainctl schema lists them "
                            "under instance.type)")
        price = usd_per_hour(value)
        if price is None:
            raise UserError(f"--prices {path}: {key}: {PRICE_RULE}, got {json.dumps(value)}", f"e.g. {FILE_EXAMPLE}")
        prices[key] = price
    modified = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
    return PriceTable("file", prices, date=modified, path=str(path))


# ---- `trainctl plan` with its prices ------------------------------------------------------------------------

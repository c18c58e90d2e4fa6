"""Scrape one Prometheus text endpoint (a sidecar's or a Retry-Node's ``/metrics``) into
``{"name{labels}": value}``; prometheus-client's own parser reads the text."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Scraped", "scrape"]

TIMEOUT_SECONDS = 2.0
BODY_BYTES_MAX = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Scraped:
    url: str
    fetched_at: str
    values: dict[str, float] = field(default_factory=dict)
    error: str | None = None


async def scrape(url: str) -> Scraped:
    fetched_at = datetime.now(UTC).isoformat()
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, trust_env=False) as client:
            response = await client.get(url)
        if response.status_code != 200:
            return Scraped(url, fetched_at, error=f"HTTP {response.status_code}")
        if len(response.content) > BODY_BYTES_MAX:
            return Scraped(url, fetched_at, error=f"more than {BODY_BYTES_MAX} bytes")
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(
                    sample.value
                )
        return Scraped(url, fetched_at, values)
    except httpx.HTTPError as exc:
        return Scraped(url, fetched_at, error=f"{type(exc).__name__}: {exc}")
    except ValueError as exc:
        return Scraped(url, fetched_at, error=f"not Prometheus text: {exc}")

"""What running a workload costs: cloud rental or owned hardware.

- Cloud: the catalog's on-demand rate per device-hour × devices (a default the user overrides).
- Owned: the purchase price spread over the busy hours of its life (life in years × 8760 h ×
  utilisation), plus electricity at the device's TDP while busy, at a price per kWh.

Both are priced per busy hour, so the cost of a job is hours × rate and the cost of a million
inferences is 1e6 / (throughput per hour) × rate. A figure is None when the catalog has no price.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from modelpress.advisor.catalog import GPU
from modelpress.errors import OptionError

HOURS_PER_YEAR = 8760.0


@dataclass(frozen=True)
class Pricing:
    life_years: float = 3.0
    electricity_usd_kwh: float = 0.15
    utilization: float = 0.6  # fraction of the life the devices are busy

    def __post_init__(self):
        if self.life_years <= 0 or self.electricity_usd_kwh < 0 or not 0 < self.utilization <= 1:
            raise OptionError("pricing: life must be > 0, electricity >= 0, utilisation in (0, 1]")


def cheaper(*usd: float | None) -> float | None:
    """The lowest of the known figures (None when none is known): renting or owning."""
    known = [v for v in usd if v is not None]
    return min(known) if known else None


@dataclass(frozen=True)
class Cost:
    cloud_usd_per_hour: float | None
    own_usd_per_hour: float | None
    cloud_usd_per_million: float | None
    own_usd_per_million: float | None
    job_hours: float | None = None
    cloud_job_usd: float | None = None
    own_job_usd: float | None = None

    @property
    def best_per_million(self) -> float | None:
        return cheaper(self.cloud_usd_per_million, self.own_usd_per_million)

    @property
    def best_job_usd(self) -> float | None:
        return cheaper(self.cloud_job_usd, self.own_job_usd)

    def to_dict(self) -> dict:
        return asdict(self)


def hourly_rates(gpu: GPU, num_gpus: int, pricing: Pricing) -> tuple[float | None, float | None]:
    """(cloud, owned) USD per busy hour for ``num_gpus`` devices."""
    cloud = gpu.cloud_usd_hr * num_gpus if gpu.cloud_usd_hr else None
    own = None
    if gpu.price_usd:
        capital = gpu.price_usd / (pricing.life_years * HOURS_PER_YEAR * pricing.utilization)
        power = (gpu.tdp_w or 0.0) / 1000 * pricing.electricity_usd_kwh
        own = (capital + power) * num_gpus
    return cloud, own


def cost_of(
    gpu: GPU, num_gpus: int, *, throughput: float, pricing: Pricing, amount: float | None = None
) -> Cost:
    """Cost per million units of ``throughput`` (per second) and, given ``amount`` units, of the job."""
    cloud, own = hourly_rates(gpu, num_gpus, pricing)
    per_hour = throughput * 3600 if throughput > 0 else 0.0

    def per_million(rate):
        return rate / per_hour * 1e6 if rate is not None and per_hour else None

    hours = amount / per_hour if amount and per_hour else None
    return Cost(
        cloud_usd_per_hour=cloud,
        own_usd_per_hour=own,
        cloud_usd_per_million=per_million(cloud),
        own_usd_per_million=per_million(own),
        job_hours=hours,
        cloud_job_usd=cloud * hours if cloud is not None and hours is not None else None,
        own_job_usd=own * hours if own is not None and hours is not None else None,
    )


__all__ = ["Cost", "Pricing", "cheaper", "cost_of", "hourly_rates"]

#!/usr/bin/env python3
"""Held-out load series for comparing forecasters: `series_id,timestamp,value`.

Each series is a cluster's utilisation fraction every 5 minutes (288 a day), in [0, 1]
and mostly 0.05..0.95. Every family starts from the same kind of day: a morning and an
evening peak whose heights and times change from day to day, on a night floor, with noise
that lasts hours (AR(1), phi 0.97 at 5-minute steps) plus a little white noise. The
families then add one thing each:

- twopeak: nothing more.
- weekend: Saturdays and Sundays much lower (a weekly season).
- trend:   a slow drift whose slope changes from day to day.
- shift:   one or two level shifts that last (step changes at random times).
- burst:   occasional short high spikes (15 min to 2 h) at random times.

Series ids are `<family>-<k>`; the family is the id up to its last '-'. The output is
deterministic for a given --seed, --per-family, --days and --start (numpy default_rng).
"""

import argparse
import contextlib
import csv
import datetime as dt
import sys

import numpy as np

STEP_MINUTES = 5
PER_DAY = 24 * 60 // STEP_MINUTES  # 288
FAMILIES = ("twopeak", "weekend", "trend", "shift", "burst")


def bump(hours: np.ndarray, centre: np.ndarray, width: float) -> np.ndarray:
    """A peak around `centre` (hours of the day), wrapping around midnight."""
    d = (hours - centre + 12.0) % 24.0 - 12.0
    return np.exp(-0.5 * (d / width) ** 2)


def twopeak(rng: np.random.Generator, n: int) -> tuple[np.ndarray, float, np.ndarray]:
    """The common base: a two-peak day whose peaks change day to day, with lasting noise.

    Returns the series, its night floor and its daily shape (without floor and noise), which
    the other families reshape.
    """
    days = -(-n // PER_DAY)
    i = np.arange(n)
    day = i // PER_DAY
    hours = (i % PER_DAY) * STEP_MINUTES / 60.0

    # The series' own day: peak times, widths, floor and heights.
    floor = rng.uniform(0.10, 0.22)
    am_at, pm_at = rng.uniform(8.5, 10.5), rng.uniform(18.0, 20.5)
    am_w, pm_w = rng.uniform(1.2, 2.2), rng.uniform(1.5, 2.8)
    am_h, pm_h = rng.uniform(0.25, 0.45), rng.uniform(0.20, 0.45)
    # A broad daytime plateau between the peaks, so the day is not two bare bumps.
    mid_h = rng.uniform(0.05, 0.15)

    # Each peak's height moves day to day: an AR(1) in log space (persistent, so a busy day
    # tends to follow a busy day, but not a constant factor a model could learn once).
    def day_factor() -> np.ndarray:
        f = np.empty(days)
        f[0] = rng.normal(0.0, 0.15)
        for d in range(1, days):
            f[d] = 0.6 * f[d - 1] + rng.normal(0.0, 0.15)
        return np.exp(f)

    am_f, pm_f = day_factor(), day_factor()
    # Peak times wander by some minutes per day, which hurts a seasonal naive forecast.
    am_c = am_at + rng.normal(0.0, 0.25, days)
    pm_c = pm_at + rng.normal(0.0, 0.30, days)

    shape = (
        am_h * am_f[day] * bump(hours, am_c[day], am_w)
        + pm_h * pm_f[day] * bump(hours, pm_c[day], pm_w)
        + mid_h * bump(hours, 0.5 * (am_at + pm_at), 4.0)
    )

    # Noise that lasts hours: AR(1) with phi 0.97 (a half-life of ~2 h at 5-minute steps),
    # stationary sd ~0.02..0.04, plus white noise of sd ~0.01.
    phi = 0.97
    sd = rng.uniform(0.02, 0.04)
    eps = rng.normal(0.0, sd * np.sqrt(1.0 - phi**2), n)
    ar = np.empty(n)
    ar[0] = rng.normal(0.0, sd)
    for t in range(1, n):
        ar[t] = phi * ar[t - 1] + eps[t]
    white = rng.normal(0.0, 0.01, n)
    return floor + shape + ar + white, floor, shape


def fit_range(y: np.ndarray, lo: float = 0.06, hi: float = 0.92) -> np.ndarray:
    """Map `y` affinely, only when needed, so its 0.2 % and 99.8 % quantiles lie in [lo, hi].

    Drifts and downward shifts would otherwise push nights below zero (clamped to a flat 0,
    which no cluster reports and which breaks sMAPE and multiplicative models).
    """
    q0, q1 = np.quantile(y, [0.002, 0.998])
    if q1 - q0 > hi - lo:
        y = lo + (y - q0) * (hi - lo) / (q1 - q0)
    elif q0 < lo:
        y = y + (lo - q0)
    elif q1 > hi:
        y = y - (q1 - hi)
    return y


def make(family: str, rng: np.random.Generator, n: int, start: dt.datetime) -> np.ndarray:
    y, floor, shape = twopeak(rng, n)
    i = np.arange(n)
    if family == "weekend":
        # Saturdays and Sundays: the peaks drop to 25..45 % and the floor a little.
        minute = start.hour * 60 + start.minute + STEP_MINUTES * i
        weekend = (start.weekday() + minute // (24 * 60)) % 7 >= 5
        keep = rng.uniform(0.25, 0.45)
        y = y - weekend * ((1.0 - keep) * shape + 0.3 * floor)
    elif family == "trend":
        # A slope (per day) that itself walks from day to day, integrated step by step so
        # the drift is continuous; it adds up to some 0.1..0.3 over two weeks.
        days = -(-n // PER_DAY)
        slope = np.cumsum(rng.normal(0.0, 0.012, days)) + rng.normal(0.0, 0.015)
        drift = np.cumsum(slope[i // PER_DAY] / PER_DAY)
        # Centre the drift's range on zero, so its whole path stays near the base level.
        y = y + drift - 0.5 * (drift.max() + drift.min())
    elif family == "shift":
        # One or two lasting level shifts of 0.08..0.2 either way, anywhere after the
        # first two days (so some fall close to, or inside, the evaluation window).
        level = np.zeros(n)
        for _ in range(rng.integers(1, 3)):
            at = rng.integers(2 * PER_DAY, n - PER_DAY // 4)
            level[at:] += rng.choice([-1.0, 1.0]) * rng.uniform(0.08, 0.2)
        y = y + level
    elif family not in ("twopeak", "burst"):
        raise ValueError(f"unknown family {family}")
    y = fit_range(y)
    if family == "burst":
        # Bursts: ~1.5 a day at random times, 15 min to 2 h long, 0.15..0.4 high, a quick
        # rise and fall around a plateau.
        for _ in range(rng.poisson(1.5 * n / PER_DAY)):
            at = rng.integers(0, n)
            length = rng.integers(3, 25)
            height = rng.uniform(0.15, 0.4)
            edge = np.minimum(np.arange(length) + 1, length - np.arange(length)) / 2.0
            seg = height * np.minimum(edge, 1.0)
            end = min(n, at + length)
            y[at:end] += seg[: end - at]
    # Only bursts (a saturated cluster) and rare noise excursions reach the bounds.
    return np.clip(y, 0.0, 1.0)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--per-family", type=int, default=4)
    p.add_argument("--days", type=int, default=14)
    p.add_argument("--start", default="2026-01-05T00:00:00Z", help="first timestamp (UTC)")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--out", default="-", help="CSV file, or - for stdout")
    args = p.parse_args()

    start = dt.datetime.strptime(args.start, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    n = args.days * PER_DAY
    stamps = [
        (start + dt.timedelta(minutes=STEP_MINUTES * k)).strftime("%Y-%m-%dT%H:%M:%SZ")
        for k in range(n)
    ]
    rng = np.random.default_rng(args.seed)
    with contextlib.ExitStack() as files:
        out = (
            sys.stdout if args.out == "-" else files.enter_context(open(args.out, "w", newline=""))
        )
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["series_id", "timestamp", "value"])
        for family in args.families.split(","):
            for k in range(args.per_family):
                y = make(family, rng, n, start)
                for stamp, v in zip(stamps, y):
                    w.writerow([f"{family}-{k}", stamp, f"{v:.6f}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

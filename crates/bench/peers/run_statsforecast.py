#!/usr/bin/env python3
"""Rolling-origin accuracy of Nixtla statsforecast's models on a `series_id,timestamp,value` CSV.

The protocol is the one `orrery-bench forecast-accuracy --input FILE.csv` follows, so the two
can be compared on the same file and origins:

- For a series of n points and H the largest horizon, the origins are
  o_k = n - H - k*stride for k = 0..origins-1. Each model is fitted once per origin on all
  the history before it, y[:o_k], and forecasts H points; a horizon h is scored on the
  first h of them against y[o_k : o_k+h].
- MASE = mean|truth - forecast| / (mean over y[:o_k] of |y_t - y_{t-season}|). As in
  Orrery's `accuracy::mase`, the lag is 1 when the training data holds no full season and
  the scale is 1 when it is ~0.
- sMAPE (%) = 100 * mean(2|a-f| / (|a|+|f|)), a term 0 when both are 0.
- coverage80 = the share of truth points inside the 80 % interval (bounds included).
- cpu_ms_per_forecast = time.process_time() around one fit+predict (the H-point forecast
  that serves every horizon of that origin), in ms.

MASE and sMAPE are averaged over origins (every origin of every series has equal weight);
coverage is pooled over points, which is the same thing as every origin has h points.

Output: one JSON object per line on stdout for every (model, horizon, family or "all");
progress on stderr. `--raw FILE` also writes one CSV row per (model, series, origin,
horizon), for comparing single origins.
"""

import os

# One thread per process: the numbers are the CPU cost of one forecast on one core, as
# Orrery's evaluator measures, and the machine is shared. Set before numpy loads BLAS.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import contextlib
import csv
import json
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import statsforecast
from statsforecast.models import MSTL, AutoARIMA, AutoETS, SeasonalNaive

LEVEL = 80
WEEK_DAYS = 7


def model_factories(season: int, weekly: bool):
    """Model name -> a function (training length -> a new, unfitted model).

    A new instance for every forecast, so nothing can carry over between origins (the
    models' `forecast` keeps no state anyway).
    """

    def seasons(n_train: int) -> list[int]:
        # MSTL takes any list of periods, but a weekly one needs two whole weeks of data to
        # be estimated at all (R's mstl drops it otherwise; statsforecast does not check).
        week = WEEK_DAYS * season
        return [season, week] if weekly and n_train >= 2 * week else [season]

    return {
        "SeasonalNaive": lambda n: SeasonalNaive(season_length=season),
        # Non-seasonal: statsforecast's ETS handles at most 24 seasonal states; with 288 it
        # does not fail but tries seasonal fits that cannot work and silently ends up with a
        # non-seasonal model. Its default model is "ZZZ" (picked by AICc); season_length=1
        # makes the seasonal part "N".
        "AutoETS": lambda n: AutoETS(season_length=1),
        # The default trend forecaster is AutoETS(model="ZZN") (non-seasonal ETS on the
        # seasonally adjusted series); the seasonal components go on as seasonal naive.
        "MSTL": lambda n: MSTL(season_length=seasons(n)),
        "MSTL-AutoARIMA": lambda n: MSTL(
            season_length=seasons(n), trend_forecaster=AutoARIMA(), alias="MSTL-AutoARIMA"
        ),
        # AutoARIMA's default season_length is 1: non-seasonal (a seasonal ARIMA at 288
        # is out of reach for its stepwise search).
        "AutoARIMA": lambda n: AutoARIMA(season_length=1),
    }


def mase_scale(y: np.ndarray, season: int) -> float:
    """Mean |y_t - y_{t-season}| over the training data, as Orrery's `mase_scale`."""
    lag = season if season >= 2 and len(y) > season else 1
    if len(y) <= lag:
        return 1.0
    mae = float(np.mean(np.abs(y[lag:] - y[:-lag])))
    return mae if mae > 1e-12 else 1.0


def smape(a: np.ndarray, f: np.ndarray) -> float:
    d = np.abs(a) + np.abs(f)
    terms = np.divide(2.0 * np.abs(a - f), d, out=np.zeros_like(d), where=d != 0.0)
    return 100.0 * float(np.mean(terms))


def horizon_label(h: int, step_minutes: float) -> str:
    minutes = h * step_minutes
    return f"{minutes / 60:g}h" if minutes % 60 == 0 else f"{minutes:g}min"


def load(path: str) -> tuple[dict[str, np.ndarray], float]:
    """Series in file order (each sorted by time) and the step in minutes."""
    df = pd.read_csv(path, dtype={"series_id": str, "value": float})
    df["timestamp"] = pd.to_datetime(df["timestamp"], utc=True)
    series = {}
    steps = []
    for sid, g in df.groupby("series_id", sort=False):
        g = g.sort_values("timestamp")
        if g["value"].isna().any():
            raise SystemExit(f"{sid}: missing values (no model here takes them)")
        series[sid] = g["value"].to_numpy(dtype=np.float64)
        steps.append(g["timestamp"].diff().dropna().median())
    step = pd.Series(steps).median().total_seconds() / 60.0 if steps else 5.0
    return series, step


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def family_of(series_id: str) -> str:
    return series_id.rsplit("-", 1)[0]


def pick(series: dict[str, np.ndarray], limit: int | None) -> dict[str, np.ndarray]:
    """The first `limit` series taken round-robin over families (so a quick run sees each)."""
    if limit is None:
        return series
    by_family = defaultdict(list)
    for sid in series:
        by_family[family_of(sid)].append(sid)
    order = []
    queues = list(by_family.values())
    while queues and len(order) < limit:
        for q in queues:
            if q and len(order) < limit:
                order.append(q.pop(0))
        queues = [q for q in queues if q]
    return {sid: series[sid] for sid in order}


@dataclass
class Scores:
    """What the origins add up to, by (model, horizon, family) or (model, family)."""

    mase: dict = field(default_factory=lambda: defaultdict(list))
    smape: dict = field(default_factory=lambda: defaultdict(list))
    inside: dict = field(default_factory=lambda: defaultdict(int))
    points: dict = field(default_factory=lambda: defaultdict(int))
    cpu: dict = field(default_factory=lambda: defaultdict(list))  # seconds per forecast
    failed: dict = field(default_factory=lambda: defaultdict(int))  # origins without one


def forecast_once(model, train: np.ndarray, h: int):
    """One fit + predict: (mean, lo, hi, CPU seconds); raises if the forecast is unusable."""
    t0 = time.process_time()
    # The call StatsForecast.forecast makes for every series and model (see
    # statsforecast/core.py), without its DataFrame bookkeeping, so the time is the model's.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = model.forecast(y=train, h=h, level=[LEVEL])
    secs = time.process_time() - t0
    mean = np.asarray(res["mean"], dtype=np.float64)
    lo = np.asarray(res[f"lo-{LEVEL}"], dtype=np.float64)
    hi = np.asarray(res[f"hi-{LEVEL}"], dtype=np.float64)
    if mean.shape != (h,) or not np.isfinite(mean).all():
        raise ValueError(f"a forecast of shape {mean.shape} or with non-finite values")
    return mean, lo, hi, secs


def evaluate(series, names, factories, horizons, labels, args, raw) -> Scores:
    """Every origin of every series, every model: the scores, and `raw` rows if asked."""
    hmax = horizons[-1]
    scores = Scores()
    started = time.perf_counter()
    for done, (sid, y) in enumerate(series.items(), start=1):
        fam = family_of(sid)
        n = len(y)
        origins = [n - hmax - k * args.stride for k in range(args.origins)]
        # An origin needs two seasons behind it (STL and seasonal naive need one at least).
        origins = [o for o in origins if o >= 2 * args.season]
        if len(origins) < args.origins:
            log(f"{sid}: only {len(origins)} origins have two seasons of history")
        series_cpu = defaultdict(float)
        for o in origins:
            train = y[:o]
            scale = mase_scale(train, args.season)
            for name in names:
                try:
                    mean, lo, hi, secs = forecast_once(factories[name](len(train)), train, hmax)
                except Exception as e:  # noqa: BLE001 - a failed fit is counted, not fatal
                    scores.failed[(name, fam)] += 1
                    log(f"{sid} origin {o}: {name} failed: {e}")
                    continue
                scores.cpu[(name, fam)].append(secs)
                series_cpu[name] += secs
                for h in horizons:
                    truth = y[o : o + h]
                    m = float(np.mean(np.abs(truth - mean[:h]))) / scale
                    s = smape(truth, mean[:h])
                    # NaN bounds (a degenerate interval) count as outside.
                    k = int(np.sum((lo[:h] <= truth) & (truth <= hi[:h])))
                    key = (name, h, fam)
                    scores.mase[key].append(m)
                    scores.smape[key].append(s)
                    scores.inside[key] += k
                    scores.points[key] += h
                    if raw is not None:
                        row = [name, sid, o, labels[h], f"{m:.6f}", f"{s:.6f}", k]
                        raw.writerow([*row, f"{secs * 1e3:.3f}"])
        elapsed = time.perf_counter() - started
        eta = elapsed / done * (len(series) - done)
        per_model = ", ".join(f"{m} {series_cpu[m]:.1f}s" for m in names)
        log(f"[{done}/{len(series)}] {sid}: {per_model} (elapsed {elapsed:.0f}s, eta {eta:.0f}s)")
    return scores


def report(scores: Scores, series, names, horizons, labels) -> None:
    """One JSON line per (model, horizon, family), "all" first."""
    families = list(dict.fromkeys(family_of(sid) for sid in series))

    def mean(values, digits, factor=1.0):
        # null, not NaN (which is no JSON), when a model failed at every origin.
        return round(factor * float(np.mean(values)), digits) if values else None

    for name in names:
        for h in horizons:
            for fam in ["all", *families]:
                fams = families if fam == "all" else [fam]
                ms = [v for f in fams for v in scores.mase[(name, h, f)]]
                ss = [v for f in fams for v in scores.smape[(name, h, f)]]
                cs = [v for f in fams for v in scores.cpu[(name, f)]]
                pts = sum(scores.points[(name, h, f)] for f in fams)
                ins = sum(scores.inside[(name, h, f)] for f in fams)
                row = {
                    "scenario": "forecast-peer",
                    "peer": f"statsforecast {statsforecast.__version__}",
                    "model": name,
                    "horizon": labels[h],
                    "family": fam,
                    "series": sum(1 for sid in series if family_of(sid) in fams),
                    "origins": len(ms),
                    "failed": sum(scores.failed[(name, f)] for f in fams),
                    "mase": mean(ms, 4),
                    "smape_percent": mean(ss, 3),
                    "coverage80": round(ins / pts, 4) if pts else None,
                    "cpu_ms_per_forecast": mean(cs, 2, 1e3),
                }
                print(json.dumps(row), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--input", required=True, help="CSV: series_id,timestamp,value")
    p.add_argument("--season", type=int, default=288, help="samples per day")
    p.add_argument("--horizons", default="12,72", help="steps ahead, comma-separated")
    p.add_argument("--origins", type=int, default=15, help="origins per series")
    p.add_argument("--stride", type=int, default=20, help="steps between origins")
    p.add_argument(
        "--models",
        default="SeasonalNaive,AutoETS,MSTL,MSTL-AutoARIMA,AutoARIMA",
        help="comma-separated subset",
    )
    p.add_argument(
        "--weekly",
        action="store_true",
        help="MSTL also gets a weekly period (7*season) where the training data holds two weeks",
    )
    p.add_argument(
        "--limit-series", type=int, help="only this many series (round-robin over families)"
    )
    p.add_argument("--raw", help="also write per-origin rows to this CSV")
    args = p.parse_args()

    horizons = sorted({int(h) for h in args.horizons.split(",")})
    hmax = horizons[-1]
    factories = model_factories(args.season, args.weekly)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in factories]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(factories)}")

    series, step_minutes = load(args.input)
    series = pick(series, args.limit_series)
    labels = {h: horizon_label(h, step_minutes) for h in horizons}
    log(
        f"statsforecast {statsforecast.__version__}: {len(series)} series, models {names}, "
        f"horizons {horizons}, {args.origins} origins every {args.stride} steps"
    )

    # A first call pays for lazy imports and one-time set-up (statsmodels' STL, the C++
    # extension): make it untimed, on a short slice, so it is not charged to one origin.
    first = next(iter(series.values()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            warm = first[: min(len(first), 3 * args.season)]
            factories[name](len(warm)).forecast(y=warm, h=hmax, level=[LEVEL])

    with contextlib.ExitStack() as files:
        raw = None
        if args.raw:
            raw = csv.writer(
                files.enter_context(open(args.raw, "w", newline="")), lineterminator="\n"
            )
            raw.writerow(
                ["model", "series_id", "origin", "horizon", "mase", "smape_percent"]
                + ["inside80", "cpu_ms"]
            )
        scores = evaluate(series, names, factories, horizons, labels, args, raw)
    report(scores, series, names, horizons, labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())

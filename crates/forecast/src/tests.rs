use super::*;

/// A deterministic stream of standard normal noise (Box-Muller over a 64-bit LCG).
struct Noise(u64);

impl Noise {
    fn uniform(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

const DAY: usize = 48;

/// `n` points of a daily cycle around 0.5 (amplitude `amp`), a trend per day and noise.
fn series(n: usize, amp: f64, trend: f64, noise: f64, seed: u64) -> Vec<f64> {
    let mut z = Noise(seed);
    (0..n)
        .map(|t| {
            let phase = std::f64::consts::TAU * t as f64 / DAY as f64;
            0.5 + amp * phase.sin() + trend * t as f64 / DAY as f64 + noise * z.normal()
        })
        .collect()
}

#[test]
fn the_naive_models_repeat_the_past_with_intervals_that_grow_by_season() {
    let y = [1.0, 3.0, 1.0, 3.0, 1.0, 3.0];
    // Lag 2: no error within the series, so no width; the values repeat by season.
    let b = naive(&y, 2, 4);
    let means: Vec<f64> = b.iter().map(|b| b.mean).collect();
    assert_eq!(means, vec![1.0, 3.0, 1.0, 3.0]);
    assert!(b.iter().all(|b| b.upper95 == b.mean));
    // Lag 1: every step errs by 2, so sigma is 2 and the band widens with sqrt(h).
    let b = naive(&y, 1, 4);
    assert!(b.iter().all(|b| b.mean == 3.0));
    let half = |i: usize| b[i].upper80 - b[i].mean;
    assert!((half(0) - 2.0 * Z80).abs() < 1e-9, "{:?}", b[0]);
    assert!((half(3) - 2.0 * Z80 * 2.0).abs() < 1e-9, "{:?}", b[3]);
    assert!(b[0].lower95 < b[0].lower80 && b[0].upper95 > b[0].upper80);
}

#[test]
fn a_daily_season_is_found_in_the_series() {
    let y = series(DAY * 10, 0.3, 0.0, 0.02, 1);
    assert_eq!(detect_season(&y, 4, DAY * 4), Some(DAY));
    // Noise alone has none worth a model; a series too short for two seasons has none.
    let flat = series(DAY * 10, 0.0, 0.0, 0.05, 2);
    assert!(
        detect_season(&flat, 4, DAY * 4).is_none_or(|s| s != DAY),
        "{:?}",
        detect_season(&flat, 4, DAY * 4)
    );
    assert_eq!(detect_season(&y[..DAY], 4, DAY * 4), None);
}

#[test]
fn each_series_gets_the_model_its_own_backtest_prefers() {
    let settings = Settings {
        season: Some(DAY),
        ..Default::default()
    };
    // (series, horizon, the models acceptable): a daily cycle goes to a seasonal model, a
    // noisy level to a non-seasonal one.
    let cases: [(Vec<f64>, usize, &[Model]); 3] = [
        (
            series(DAY * 14, 0.3, 0.0, 0.02, 3),
            DAY / 2,
            &[Model::SeasonalNaive, Model::MstlEts, Model::MstlAr],
        ),
        (
            series(DAY * 14, 0.3, 0.05, 0.02, 4),
            DAY / 2,
            &[Model::MstlEts, Model::MstlAr, Model::SeasonalNaive],
        ),
        (
            series(DAY * 14, 0.0, 0.0, 0.05, 5),
            DAY / 2,
            &[Model::Naive, Model::Ets],
        ),
    ];
    for (i, (y, h, ok)) in cases.iter().enumerate() {
        let f = forecast(y, *h, &settings).unwrap();
        assert!(ok.contains(&f.model), "case {i}: {:?}", f.model);
        assert_eq!(f.points.len(), *h);
        assert!(f.backtest_mase.is_some());
        for p in &f.points {
            assert!(
                p.lower95 <= p.lower80 && p.lower80 <= p.mean,
                "case {i}: {p:?}"
            );
            assert!(
                p.mean <= p.upper80 && p.upper80 <= p.upper95,
                "case {i}: {p:?}"
            );
        }
    }
}

/// Four steps ahead from every 8th point of each series from its 15th day on: the chosen
/// model's error over the seasonal naive's, and the share of truths its 80 % band holds.
fn scored(ys: &[Vec<f64>], settings: &Settings) -> (f64, f64) {
    let (mut inside, mut total, mut model_err, mut snaive_err) = (0, 0, 0.0, 0.0);
    for y in ys {
        for start in (DAY * 14..y.len() - 4).step_by(8) {
            let (past, next) = (&y[..start], &y[start..start + 4]);
            let f = forecast(past, next.len(), settings).unwrap();
            let sn = naive(past, DAY, next.len());
            for ((p, s), a) in f.points.iter().zip(&sn).zip(next) {
                total += 1;
                inside += usize::from(p.lower80 <= *a && *a <= p.upper80);
                model_err += (a - p.mean).abs();
                snaive_err += (a - s.mean).abs();
            }
        }
    }
    (model_err / snaive_err, inside as f64 / total as f64)
}

#[test]
fn a_seasonal_forecast_beats_the_seasonal_naive_and_its_band_covers_what_follows() {
    // Fourteen days of history, then the next day in 2-hour forecasts: the chosen model's
    // error against the seasonal naive's, and how often the 80 % band holds the truth.
    let settings = Settings {
        season: Some(DAY),
        ..Default::default()
    };
    let ys: Vec<Vec<f64>> = (10..14)
        .map(|seed| series(DAY * 15 + 4, 0.3, 0.02, 0.03, seed))
        .collect();
    let (ratio, coverage) = scored(&ys, &settings);
    assert!(
        (0.65..=0.95).contains(&coverage),
        "80 % band held {coverage:.2}"
    );
    assert!(ratio <= 1.0, "chosen over seasonal naive: {ratio:.3}");
}

/// `n` points of a daily cycle around 0.5 with deviations that last: each step keeps `rho` of
/// the last one's (an AR(1) process of standard deviation `sigma`).
fn lasting(n: usize, amp: f64, rho: f64, sigma: f64, seed: u64) -> Vec<f64> {
    let mut z = Noise(seed);
    let mut e = 0.0;
    (0..n)
        .map(|t| {
            e = rho * e + (1.0 - rho * rho).sqrt() * sigma * z.normal();
            0.5 + amp * (std::f64::consts::TAU * t as f64 / DAY as f64).sin() + e
        })
        .collect()
}

/// Over lasting deviations, the chosen model and its band a few steps ahead: its mean error
/// against the seasonal naive's, and how often its 80 % band holds the truth, with the
/// choice made on `folds` and the intervals calibrated on `calibration_folds`.
fn lasting_errors(folds: usize, calibration_folds: usize) -> (f64, f64) {
    let settings = Settings {
        season: Some(DAY),
        folds,
        calibration_folds,
        ..Default::default()
    };
    let ys: Vec<Vec<f64>> = (20..24)
        .map(|seed| lasting(DAY * 16, 0.2, 0.9, 0.05, seed))
        .collect();
    scored(&ys, &settings)
}

#[test]
fn lasting_deviations_are_forecast_better_than_a_day_before_with_calibrated_bands() {
    // A deviation that lasts is still there a few steps on: the models that follow the level
    // beat the value of a day before (which repeats yesterday's deviation and misses today's).
    let (ratio, coverage) = lasting_errors(8, 8);
    assert!(ratio < 0.7, "chosen over seasonal naive: {ratio:.3}");
    assert!(
        (0.7..=0.9).contains(&coverage),
        "80 % band held {coverage:.3}"
    );
    // Chosen on three folds and calibrated on those alone, the band is narrower than when
    // five older folds are added to them.
    let (_, narrow) = lasting_errors(3, 3);
    let (_, wider) = lasting_errors(3, 8);
    assert!(narrow < wider, "{narrow:.3} vs {wider:.3}");
}

#[test]
fn bad_histories_are_refused_and_short_ones_get_the_simplest_model() {
    let s = Settings::default();
    assert!(matches!(
        forecast(&[1.0], 3, &s),
        Err(ForecastError::TooShort(1))
    ));
    assert!(matches!(
        forecast(&[1.0, f64::NAN, 2.0], 3, &s),
        Err(ForecastError::NotFinite)
    ));
    // Twelve points backtest one fold of ten; three folds do not fit, one does.
    let f = forecast(&(0..12).map(f64::from).collect::<Vec<_>>(), 10, &s).unwrap();
    assert!(f.backtest_mase.is_some(), "{f:?}");
    let f = forecast(&[0.2, 0.4], 3, &s).unwrap();
    assert_eq!(f.model, Model::Naive);
    assert_eq!(f.backtest_mase, None);
    assert!(f.points.iter().all(|p| p.mean == 0.4));
    // Never below zero.
    let f = forecast(&[0.05, 0.01, 0.0, 0.0, 0.0], 2, &s).unwrap();
    assert!(f.points.iter().all(|p| p.lower95 >= 0.0));
    // A seasonal model asked of a series shorter than two seasons is refused, not guessed.
    assert!(predict(Model::MstlEts, &[0.1; 10], 8, 2).is_err());
}

#[test]
fn accuracy_measures_are_right_on_known_values() {
    // The training data's one-step naive error is 1; the forecast misses by 2 each time.
    let training = [0.0, 1.0, 2.0, 3.0];
    assert_eq!(accuracy::mase(&[5.0, 6.0], &[3.0, 4.0], &training, 1), 2.0);
    assert!((accuracy::smape(&[1.0, 1.0], &[1.0, 3.0]) - 50.0).abs() < 1e-9);
    assert_eq!(accuracy::smape(&[0.0], &[0.0]), 0.0);
}

#[test]
fn an_autoregression_finds_known_coefficients_and_refuses_what_is_not_stationary() {
    // (φ of the process, the order AIC should find): simulated, then fitted.
    let cases: [(&[f64], usize); 3] = [(&[0.9], 1), (&[1.2, -0.5], 2), (&[0.5, 0.0, 0.3], 3)];
    for (i, (phi, order)) in cases.iter().enumerate() {
        let mut z = Noise(40 + i as u64);
        let mut x = vec![0.0; 3];
        for _ in 0..4000 {
            let n = x.len();
            let v = 0.1 + (1..=phi.len()).map(|j| phi[j - 1] * x[n - j]).sum::<f64>();
            x.push(v + 0.05 * z.normal());
        }
        let best = (1..=AR_MAX_ORDER)
            .filter_map(|p| Ar::fit(&x, p, AR_MAX_ORDER))
            .min_by(|a, b| a.aic.total_cmp(&b.aic))
            .unwrap();
        // AIC may add a spurious order; the true ones are found within a few hundredths.
        assert!(best.phi.len() >= *order, "case {i}: {best:?}");
        for (j, want) in phi.iter().enumerate() {
            assert!((best.phi[j] - want).abs() < 0.05, "case {i}: {best:?}");
        }
        assert!(
            (best.sigma2.sqrt() - 0.05).abs() < 0.005,
            "case {i}: {best:?}"
        );
        // Forecast far ahead, it returns to the process' mean, c / (1 − Σφ).
        let mean = 0.1 / (1.0 - phi.iter().sum::<f64>());
        let far = best.forecast(&x, 2000);
        assert!(
            (far[1999].mean - mean).abs() < 0.05 * mean.abs().max(1.0),
            "case {i}"
        );
        // Its band widens with the steps ahead, to the process' own spread.
        assert!(far[0].upper80 - far[0].mean < far[1999].upper80 - far[1999].mean);
    }
    // (φ, stationary): the roots inside or outside the unit circle.
    let table: [(&[f64], bool); 7] = [
        (&[0.5], true),
        (&[-0.97], true),
        (&[1.0], false),
        (&[1.5, -0.56], true),
        (&[0.5, 0.6], false),
        (&[0.0, -1.1], false),
        (&[0.3, 0.2, 0.1], true),
    ];
    for (phi, want) in table {
        assert_eq!(stationary(phi), want, "{phi:?}");
    }
    // A random walk is no AR that returns: every order is refused, and what is left is flat.
    let walk: Vec<f64> = (0..500).map(f64::from).collect();
    assert!((1..=3).all(|p| Ar::fit(&walk, p, 3).is_none()));
}

#[test]
fn the_near_band_takes_its_own_model_and_its_own_interval_scale() {
    // (near model, far model): the first two steps from the near one, the rest from the far
    // one, each band widened by its own factor.
    let y = [1.0, 3.0, 1.0, 3.0, 1.0, 4.0];
    let cases = [
        (Model::Naive, Model::SeasonalNaive, [4.0, 4.0, 1.0, 4.0]),
        (Model::SeasonalNaive, Model::Naive, [1.0, 4.0, 4.0, 4.0]),
        (Model::Naive, Model::Naive, [4.0, 4.0, 4.0, 4.0]),
    ];
    let s = Settings::default();
    for (near, far, want) in cases {
        let choice = Choice {
            near: Some(Near {
                model: near,
                steps: 2,
                backtest_mase: 0.5,
                interval_scale: 2.0,
            }),
            interval_scale: 0.5,
            ..Choice::of(far, 2)
        };
        let f = forecast_with(&choice, &y, 4, &s).unwrap();
        let means: Vec<f64> = f.points.iter().map(|p| p.mean).collect();
        assert_eq!(means, want, "{near} then {far}");
        assert_eq!((f.model, f.near_model), (far, Some(near)));
        let raw = |m: Model, h: usize| {
            let b = predict(m, &y, 2, 4).unwrap()[h];
            b.upper80 - b.mean
        };
        for h in 0..4 {
            let (m, k) = if h < 2 { (near, 2.0) } else { (far, 0.5) };
            let half = f.points[h].upper80 - f.points[h].mean;
            assert!(
                (half - k * raw(m, h)).abs() < 1e-9,
                "{near} then {far}, step {h}"
            );
        }
    }
}

#[test]
fn a_backtest_scores_and_calibrates_each_band_on_its_own_steps() {
    // Steps 0 and 1 err by 1 (a ratio of 1 to the half-width), steps 2 and 3 by 3 (ratio 3).
    let points: Vec<(usize, f64, f64)> = (0..40)
        .map(|i| {
            let h = i % 4;
            if h < 2 { (h, 1.0, 1.0) } else { (h, 3.0, 3.0) }
        })
        .collect();
    let b = Backtest { points };
    assert_eq!(b.mase(0..2), Some(1.0));
    assert_eq!(b.mase(2..4), Some(3.0));
    assert_eq!(b.mase(0..4), Some(2.0));
    assert_eq!(b.mase(4..8), None);
    assert_eq!(b.interval_scale(0..2), 1.0);
    assert_eq!(b.interval_scale(2..4), 3.0);
    // Too few points to say: the model's own band.
    assert_eq!(b.interval_scale(0..1), 1.0);
}

#[test]
fn each_band_of_a_series_gets_the_model_that_forecast_that_band_best() {
    // (series, horizon, far models acceptable, near models acceptable). A daily cycle with a
    // deviation that lasts a few hours: far ahead the deviation is gone and a season is what
    // is left, near it is still there and a model that follows it wins. Noise with no cycle:
    // no seasonal model in either band.
    let settings = Settings {
        season: Some(DAY),
        ..Default::default()
    };
    let mstl: &[Model] = &[Model::MstlEts, Model::MstlAr];
    let level: &[Model] = &[Model::Naive, Model::Ets];
    type Case<'a> = (Vec<f64>, usize, &'a [Model], &'a [Model]);
    let cases: [Case; 2] = [
        (lasting(DAY * 14, 0.3, 0.95, 0.05, 50), DAY, mstl, mstl),
        (series(DAY * 14, 0.0, 0.0, 0.05, 51), DAY, level, level),
    ];
    for (i, (y, h, far, near)) in cases.iter().enumerate() {
        let c = choose(y, *h, &settings).unwrap();
        assert!(far.contains(&c.model), "case {i}: {c:?}");
        let n = c.near.as_ref().expect("a near band");
        assert_eq!(n.steps, near_steps(*h), "case {i}");
        assert!(near.contains(&n.model), "case {i}: {c:?}");
        // The near band's score is its own, no worse than the far model's over those steps.
        assert!(
            n.backtest_mase.is_finite() && n.interval_scale > 0.0,
            "case {i}: {c:?}"
        );
    }
    // A horizon too short to split has no near band.
    let c = choose(&series(DAY * 4, 0.3, 0.0, 0.02, 52), 5, &settings).unwrap();
    assert!(c.near.is_none(), "{c:?}");
}

/// `days` days of a daily cycle whose Saturdays and Sundays (days 5 and 6 of each week, from
/// a Monday) are at a third of the weekdays' load, with noise.
fn weekly(days: usize, seed: u64) -> Vec<f64> {
    let mut z = Noise(seed);
    (0..days * DAY)
        .map(|t| {
            let phase = std::f64::consts::TAU * t as f64 / DAY as f64;
            let weekend = (t / DAY) % 7 >= 5;
            let day = 0.5 + 0.3 * phase.sin();
            day * if weekend { 0.33 } else { 1.0 } + 0.01 * z.normal()
        })
        .collect()
}

#[test]
fn the_long_season_is_taken_where_two_of_it_precede_the_folds_and_it_forecasts_better() {
    let week = 7 * DAY;
    let horizon = DAY / 4;
    let with = Settings {
        season: Some(DAY),
        long_season: Some(week),
        ..Default::default()
    };
    let without = Settings {
        long_season: None,
        ..with.clone()
    };
    // Each history ends on a Friday night: what follows is a Saturday morning.
    let cases = [
        // (days of history, long season given, long season expected)
        (19, true, week),
        (19, false, 0),
        // Two weeks and a few days, but the folds reach back before the second week.
        (12, true, 0),
    ];
    for (days, given, expected) in cases {
        let y = weekly(days + 1, 7);
        let (past, next) = y.split_at(days * DAY);
        let settings = if given { &with } else { &without };
        let choice = choose(past, horizon, settings).unwrap();
        assert_eq!(choice.long_season, expected, "{days} days, given {given}");
        let f = forecast_with(&choice, past, horizon, settings).unwrap();
        assert_eq!(f.long_season, expected, "{days} days: the forecast says so");
        if expected > 0 {
            // The weekly season knows Saturday comes; the daily one alone does not.
            let err = |f: &Forecast| {
                let mean: Vec<f64> = f.points.iter().map(|p| p.mean).collect();
                accuracy::mase(&next[..horizon], &mean, past, DAY)
            };
            let daily = forecast(past, horizon, &without).unwrap();
            // The near band is chosen and forecast without the long season, as if none
            // were given.
            let plain = choose(past, horizon, &without).unwrap();
            assert!(choice.near.is_some());
            assert_eq!(choice.near, plain.near);
            let steps = near_steps(horizon);
            assert_eq!(f.points[..steps], daily.points[..steps]);
            assert!(
                err(&f) < 0.5 * err(&daily),
                "with the week {:.3}, without {:.3}",
                err(&f),
                err(&daily)
            );
        }
    }
}

#[test]
fn a_burst_stays_out_of_the_season_the_robust_decomposition_learns() {
    // Twelve days of a daily cycle; on the last, a burst of 0.6 for six samples (a quarter
    // of an hour's worth of samples at this scale). The season of the last cycle, which a
    // forecast repeats, at the burst's phases: the plain fit takes part of the burst into
    // it, the robust one (the one used) keeps it out.
    let days = 12;
    let mut y = series(days * DAY, 0.2, 0.0, 0.01, 7);
    let burst = (days - 1) * DAY + 10..(days - 1) * DAY + 16;
    for t in burst.clone() {
        y[t] += 0.6;
    }
    let season = |h: usize| 0.2 * (std::f64::consts::TAU * h as f64 / DAY as f64).sin();
    let worst = |robust: usize| {
        let d = decompose_with(Model::MstlAr, &y, &[DAY], robust).expect("decomposed");
        (10..16)
            .map(|h| (d.cycle[h] - season(h)).abs())
            .fold(0.0, f64::max)
    };
    let (plain, robust) = (worst(0), worst(ROBUST_PASSES));
    assert!(plain > 0.05, "the plain fit takes in the burst: {plain}");
    assert!(
        robust < plain / 3.0 && robust < 0.03,
        "the robust fit keeps it out: {robust} against {plain}"
    );
    // The burst is not lost: it is in the rest, where the forecast of the next steps sees it.
    let d = decompose(Model::MstlAr, &y, &[DAY]).expect("decomposed");
    let t = (days - 1) * DAY + 12;
    assert!(
        d.rest[t] - d.rest[t - DAY] > 0.4,
        "{}",
        d.rest[t] - d.rest[t - DAY]
    );
}

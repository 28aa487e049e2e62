//! Steps of a slow request, as Kubernetes' request traces ("Trace[..]: ... total time"): a
//! request that takes longer than [`crate::app::ApiConfig::slow_request_threshold`] is logged
//! with the time each of its steps took, so that where a tail latency goes (waiting for a slot
//! or the body, the store's read, its write, the handler's own work) can be told from the
//! logs of a server under load.
//!
//! The steps of the request being served are task-local: code that serves it marks the end of
//! a step with [`step`], wherever it is, without carrying a trace through every call.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant};

tokio::task_local! {
    static STEPS: RefCell<Steps>;
}

/// The steps a request has finished, in order, with the time each took.
#[derive(Debug)]
pub struct Steps {
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Steps {
    fn new() -> Steps {
        Steps {
            last: Instant::now(),
            done: Vec::new(),
        }
    }

    fn mark(&mut self, name: &'static str, now: Instant) {
        self.done
            .push((name, now.saturating_duration_since(self.last)));
        self.last = now;
    }

    /// `name=1.2ms name=0.3ms ...`, with the time since the last step as `rest`.
    pub fn render(&self, now: Instant) -> String {
        let mut out = String::new();
        let rest = ("rest", now.saturating_duration_since(self.last));
        for (name, d) in self.done.iter().chain(std::iter::once(&rest)) {
            if !out.is_empty() {
                out.push(' ');
            }
            // Writing to a String cannot fail.
            let _ = write!(out, "{name}={:.1}ms", d.as_secs_f64() * 1000.0);
        }
        out
    }
}

/// Marks the end of a step of the request being served; nothing outside a request.
pub fn step(name: &'static str) {
    let _ = STEPS.try_with(|s| s.borrow_mut().mark(name, Instant::now()));
}

/// Runs `f` (a request being served) with its steps recorded, and returns them with its
/// output.
pub async fn traced<F: Future>(f: F) -> (F::Output, Steps) {
    STEPS
        .scope(RefCell::new(Steps::new()), async {
            let out = f.await;
            let steps = STEPS.with(|s| std::mem::replace(&mut *s.borrow_mut(), Steps::new()));
            (out, steps)
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn steps_are_recorded_in_order_within_a_request_and_nowhere_else() {
        // Outside a traced request, a step is nothing (and does not panic).
        step("ignored");
        let ((), steps) = traced(async {
            step("first");
            tokio::time::sleep(Duration::from_millis(20)).await;
            step("second");
        })
        .await;
        let names: Vec<&str> = steps.done.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["first", "second"]);
        assert!(steps.done[1].1 >= Duration::from_millis(20), "{steps:?}");
        assert!(steps.done[0].1 < Duration::from_millis(20), "{steps:?}");
        let text = steps.render(steps.last + Duration::from_micros(2500));
        assert!(text.starts_with("first="), "{text}");
        assert!(text.contains(" second="), "{text}");
        assert!(text.ends_with(" rest=2.5ms"), "{text}");
        // Two requests served at once keep their own steps.
        let (a, b) = tokio::join!(traced(async { step("a") }), traced(async { step("b") }));
        assert_eq!(a.1.done.len(), 1);
        assert_eq!(a.1.done[0].0, "a");
        assert_eq!(b.1.done[0].0, "b");
    }
}

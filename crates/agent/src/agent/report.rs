//! Work statuses reported to the server in batches.

use super::*;

pub(super) async fn report_loop(inner: &Inner, t: &Transport) -> End {
    let mut changed = inner.backend.changed();
    let mut last = Instant::now() - inner.cfg.report_interval;
    let mut last_milestone = inner.backend.milestone();
    let mut last_full = Instant::now();
    let mut last_flush = Instant::now();
    let mut flush_cost = Duration::ZERO;
    loop {
        tokio::select! {
            _ = changed.changed() => {}
            _ = inner.report_now.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        // Rate limit: at most one report per interval, whatever the churn; a transfer's
        // milestone, or any change of a workload just released from a hold, goes at once
        // (a migration waits for them with its workload stopped), even one that comes while
        // this waits.
        let since = last.elapsed();
        if since < inner.cfg.report_interval && !inner.urgent(last_milestone) {
            let until = tokio::time::sleep(inner.cfg.report_interval - since);
            tokio::pin!(until);
            loop {
                tokio::select! {
                    _ = &mut until => break,
                    _ = changed.changed() => {
                        if inner.urgent(last_milestone) {
                            break;
                        }
                    }
                }
            }
        }
        last_milestone = inner.backend.milestone();
        last = Instant::now();
        // Not while a Work is being applied (its statuses are reported meanwhile); the next
        // report retries.
        if let Ok(_member) = inner.member.try_lock() {
            inner.retry_failed().await;
            inner.release_held().await;
        }
        // The state file holds every applied Work: with thousands of them, rewriting it on
        // every report would cost more than the reports. Saving is paced to take at most a
        // tenth of the time (a small state is saved on every report, as before).
        if last_flush.elapsed() >= flush_cost * 10 {
            let started = Instant::now();
            inner.flush_state().await;
            flush_cost = started.elapsed();
            last_flush = Instant::now();
        }
        // Now and then every object is read again, stamps or not; still only what differs
        // from the server's copy is sent.
        let everything = last_full.elapsed() >= inner.cfg.resync_interval;
        if everything {
            last_full = Instant::now();
        }
        let items = inner.changed_statuses(everything).await;
        for chunk in items.chunks(crate::MAX_BATCH) {
            let payload: Vec<Value> = chunk.iter().map(|(_, _, _, item)| item.clone()).collect();
            let sent = Instant::now();
            let answer = t.report(payload).await;
            crate::stats::report(sent.elapsed(), chunk.len());
            match answer {
                Ok(results) => {
                    // A Work deleted since it was read (its deletion is on its way to this
                    // agent) is no news; any other refusal is.
                    let gone = |why: &String| why.starts_with("NOT_FOUND");
                    let failed = results
                        .iter()
                        .filter(|r| r.as_ref().is_some_and(|w| !gone(w)))
                        .count();
                    let refusal = |news: bool| {
                        results.iter().enumerate().find_map(|(i, r)| {
                            r.as_ref().filter(|w| gone(w) != news).map(|w| (i, w))
                        })
                    };
                    if let Some((i, why)) = refusal(true).or_else(|| refusal(false)) {
                        let first = format!("{}: {why}", chunk[i].0);
                        if failed > 0 {
                            tracing::warn!(cluster = %inner.cfg.cluster, failed, %first, "some status reports were refused");
                        } else {
                            tracing::debug!(cluster = %inner.cfg.cluster, %first, "status reports of Works deleted meanwhile were refused");
                        }
                    }
                    let mut reported = inner.reported.lock();
                    let mut refused = inner.refused.lock();
                    let mut urgent = inner.urgent.lock();
                    for ((name, h, conds, _), result) in chunk.iter().zip(&results) {
                        // A released workload reported available needs no haste any more.
                        if result.is_none()
                            && conditions::find(conds, work::CONDITION_AVAILABLE)
                                .is_some_and(Condition::is_true)
                        {
                            urgent.remove(name);
                        }
                        if let Some(why) = result {
                            // Not what the server has: sent again after a while (soon, where
                            // the refusal was the moment's).
                            reported.remove(name);
                            let last = refused.get(name).map(|(_, d)| *d);
                            refused.insert(name.clone(), (Instant::now(), refusal_hold(why, last)));
                        } else {
                            reported.insert(name.clone(), (*h, conds.clone()));
                            refused.remove(name);
                        }
                    }
                }
                Err(e) => return e.into(),
            }
        }
    }
}

//! Seats for requests, shared fairly: Kubernetes' API Priority and Fairness in spirit.
//!
//! The requests served at once (`--max-requests-inflight` read-only,
//! `--max-mutating-requests-inflight` mutating) are split among priority levels, so that one
//! kind of caller can never take the seats another needs:
//!
//! | level | who | guaranteed share | may borrow idle seats |
//! |---|---|---|---|
//! | exempt | `system:masters` (the admin, other replicas) | not counted | — |
//! | `system` | member agents, bootstrap tokens | 50 % | yes |
//! | `leader-election` | anyone's Lease writes (`coordination.k8s.io`) | 10 % | no |
//! | `workload` | every other user and ServiceAccount | 40 % | no |
//!
//! Within a level each user (a *flow*, as APF's `ByUser` distinguisher) has a queue of its
//! own, and a freed seat goes to the next flow in turn: one user's requests wait behind each
//! other, never in front of another user's. A request that finds no seat waits in its flow's
//! queue up to the queue timeout; beyond the queue's length or that time it is told to come
//! back (429). The agents' level may use seats the others leave idle (a fleet's heartbeats
//! and status are most of the traffic); a freed seat goes first to a level below its
//! guarantee, so a level that lent its seats has them back as soon as a request ends. Users'
//! requests do not borrow: however many or slow they are, the agents keep their half.
//!
//! Request bodies are read before a seat is taken (with a deadline, `router.rs`), so a slow
//! client holds a connection, never a seat.
//!
//! ```text
//!   acquire ──► seat free for the level, nobody queued? ──yes──► Seat
//!                   │ no
//!                   ▼
//!              flow queue full? ──yes──► 429 (queue full)
//!                   │ no
//!                   ▼
//!              wait in the flow's queue ──seat handed over──► Seat
//!                   │ queue timeout
//!                   ▼
//!                  429 (timed out)          Seat dropped ──► next flow of the neediest level
//! ```

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

/// A priority level (the exempt one takes no seat).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    System,
    LeaderElection,
    Workload,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::System, Level::LeaderElection, Level::Workload];

    pub fn name(self) -> &'static str {
        match self {
            Level::System => "system",
            Level::LeaderElection => "leader-election",
            Level::Workload => "workload",
        }
    }

    fn index(self) -> usize {
        match self {
            Level::System => 0,
            Level::LeaderElection => 1,
            Level::Workload => 2,
        }
    }

    /// Its guaranteed share of the seats, in percent.
    fn share(self) -> usize {
        match self {
            Level::System => 50,
            Level::LeaderElection => 10,
            Level::Workload => 40,
        }
    }

    /// Whether it may take seats other levels leave idle.
    fn borrows(self) -> bool {
        matches!(self, Level::System)
    }
}

/// How long a request may wait for a seat by default (as APF: a quarter of kube-apiserver's
/// 60 s request timeout).
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(15);
/// How many of one user's requests may wait for a seat at once by default (APF's default
/// queue length).
pub const DEFAULT_QUEUE_LENGTH: usize = 50;

/// Why a request got no seat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its user already has as many requests waiting as a queue holds.
    QueueFull,
    /// It waited the queue timeout.
    TimedOut,
}

impl Refused {
    pub fn reason(self) -> &'static str {
        match self {
            Refused::QueueFull => "queue-full",
            Refused::TimedOut => "time-out",
        }
    }
}

/// What one level holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LevelStats {
    pub guaranteed: usize,
    pub in_use: usize,
    pub queued: usize,
}

struct Waiter {
    id: u64,
    grant: oneshot::Sender<()>,
}

#[derive(Default)]
struct Lane {
    guaranteed: usize,
    in_use: usize,
    queued: usize,
    /// Each flow's waiting requests, oldest first.
    queues: HashMap<Arc<str>, VecDeque<Waiter>>,
    /// Flows with waiting requests, in the order they are next served.
    turn: VecDeque<Arc<str>>,
}

struct State {
    total: usize,
    in_use: usize,
    lanes: [Lane; 3],
    next_id: u64,
}

impl State {
    fn admits(&self, level: Level) -> bool {
        let lane = &self.lanes[level.index()];
        self.in_use < self.total && (lane.in_use < lane.guaranteed || level.borrows())
    }

    fn take(&mut self, level: Level) {
        self.in_use += 1;
        self.lanes[level.index()].in_use += 1;
    }

    fn give_back(&mut self, level: Level) {
        self.in_use = self.in_use.saturating_sub(1);
        let lane = &mut self.lanes[level.index()];
        lane.in_use = lane.in_use.saturating_sub(1);
    }

    /// Removes a waiter still queued; false when it was handed a seat already.
    fn withdraw(&mut self, level: Level, flow: &Arc<str>, id: u64) -> bool {
        let lane = &mut self.lanes[level.index()];
        let Some(q) = lane.queues.get_mut(flow) else {
            return false;
        };
        let Some(at) = q.iter().position(|w| w.id == id) else {
            return false;
        };
        q.remove(at);
        lane.queued -= 1;
        if q.is_empty() {
            lane.queues.remove(flow);
            lane.turn.retain(|f| f != flow);
        }
        true
    }

    /// Hands free seats to waiting requests: levels below their guarantee first, then those
    /// that borrow; within a level, one flow after another.
    fn dispatch(&mut self) {
        loop {
            let needy = Level::ALL.into_iter().find(|l| {
                let lane = &self.lanes[l.index()];
                lane.queued > 0 && lane.in_use < lane.guaranteed && self.in_use < self.total
            });
            let level = match needy {
                Some(l) => l,
                None => match Level::ALL
                    .into_iter()
                    .find(|l| self.lanes[l.index()].queued > 0 && self.admits(*l))
                {
                    Some(l) => l,
                    None => return,
                },
            };
            let lane = &mut self.lanes[level.index()];
            let Some(flow) = lane.turn.pop_front() else {
                return;
            };
            let Some(q) = lane.queues.get_mut(&flow) else {
                continue;
            };
            let Some(w) = q.pop_front() else {
                lane.queues.remove(&flow);
                continue;
            };
            lane.queued -= 1;
            if q.is_empty() {
                lane.queues.remove(&flow);
            } else {
                lane.turn.push_back(flow);
            }
            self.take(level);
            // The seat is the waiter's from now on; if it has gone, its guard gives it back.
            let _ = w.grant.send(());
        }
    }
}

/// The seats of one kind (read-only or mutating).
pub struct Seats {
    state: Mutex<State>,
    queue_length: usize,
    queue_timeout: Duration,
}

impl std::fmt::Debug for Seats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seats")
            .field("queue_length", &self.queue_length)
            .field("queue_timeout", &self.queue_timeout)
            .finish_non_exhaustive()
    }
}

/// One request's seat, given back when dropped.
#[derive(Debug)]
pub struct Seat {
    seats: Arc<Seats>,
    level: Level,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut st = self.seats.lock();
        st.give_back(self.level);
        st.dispatch();
    }
}

/// A request waiting in its queue; dropped before it is done (the client went away), it
/// leaves the queue, or gives back the seat it was handed meanwhile.
struct Pending<'a> {
    seats: &'a Arc<Seats>,
    level: Level,
    flow: Arc<str>,
    id: u64,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.seats.lock();
        if !st.withdraw(self.level, &self.flow, self.id) {
            st.give_back(self.level);
            st.dispatch();
        }
    }
}

impl Seats {
    /// `total` seats split among the levels by their shares (each level at least one).
    pub fn new(total: usize, queue_length: usize, queue_timeout: Duration) -> Arc<Seats> {
        let mut lanes: [Lane; 3] = Default::default();
        for l in Level::ALL {
            lanes[l.index()].guaranteed = (total * l.share() / 100).max(1);
        }
        let total = total.max(lanes.iter().map(|l| l.guaranteed).sum());
        Arc::new(Seats {
            state: Mutex::new(State {
                total,
                in_use: 0,
                lanes,
                next_id: 0,
            }),
            queue_length: queue_length.max(1),
            queue_timeout,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it: every change to it is
        // a few counter updates done together.
        self.state.lock()
    }

    /// A seat at `level` for a request of `flow` (its user), waiting in the flow's queue if
    /// none is free.
    pub async fn acquire(self: &Arc<Self>, level: Level, flow: &str) -> Result<Seat, Refused> {
        let (id, rx, flow) = {
            let mut st = self.lock();
            if st.admits(level) && st.lanes[level.index()].queued == 0 {
                st.take(level);
                return Ok(Seat {
                    seats: self.clone(),
                    level,
                });
            }
            let queue_length = self.queue_length;
            let lane = &mut st.lanes[level.index()];
            let flow: Arc<str> = lane
                .queues
                .get_key_value(flow)
                .map(|(k, _)| k.clone())
                .unwrap_or_else(|| Arc::from(flow));
            if lane.queues.get(&flow).map_or(0, VecDeque::len) >= queue_length {
                return Err(Refused::QueueFull);
            }
            let id = st.next_id;
            st.next_id += 1;
            let (tx, rx) = oneshot::channel();
            let lane = &mut st.lanes[level.index()];
            let q = lane.queues.entry(flow.clone()).or_default();
            if q.is_empty() {
                lane.turn.push_back(flow.clone());
            }
            q.push_back(Waiter { id, grant: tx });
            lane.queued += 1;
            // A seat may have come free between the check and now only under this lock:
            // nothing to hand over yet, but a level that admits may serve its queue at once.
            st.dispatch();
            (id, rx, flow)
        };
        let mut pending = Pending {
            seats: self,
            level,
            flow,
            id,
            done: false,
        };
        let granted = match tokio::time::timeout(self.queue_timeout, rx).await {
            Ok(Ok(())) => true,
            // The sender went without a seat (never happens: waiters leave only by dispatch or
            // withdrawal) or the time is up: whichever it was, the state says.
            Ok(Err(_)) | Err(_) => {
                let mut st = self.lock();
                !st.withdraw(level, &pending.flow, id)
            }
        };
        pending.done = true;
        if granted {
            Ok(Seat {
                seats: self.clone(),
                level,
            })
        } else {
            Err(Refused::TimedOut)
        }
    }

    /// What each level holds now.
    pub fn stats(&self) -> [(Level, LevelStats); 3] {
        let st = self.lock();
        Level::ALL.map(|l| {
            let lane = &st.lanes[l.index()];
            (
                l,
                LevelStats {
                    guaranteed: lane.guaranteed,
                    in_use: lane.in_use,
                    queued: lane.queued,
                },
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seats(total: usize) -> Arc<Seats> {
        Seats::new(total, 3, Duration::from_millis(300))
    }

    fn in_use(s: &Seats, l: Level) -> usize {
        s.stats()[l.index()].1.in_use
    }

    #[tokio::test]
    async fn each_level_keeps_its_share_whatever_users_do() {
        let s = seats(10);
        // The shares: 5 system, 1 leader-election, 4 workload.
        assert_eq!(
            s.stats().map(|(_, st)| st.guaranteed),
            [5, 1, 4],
            "{:?}",
            s.stats()
        );
        let mut held = Vec::new();
        for i in 0..4 {
            held.push(s.acquire(Level::Workload, &format!("u{i}")).await.unwrap());
        }
        // Users do not borrow: the fifth waits, and is told to come back in the end...
        let started = tokio::time::Instant::now();
        assert_eq!(
            s.acquire(Level::Workload, "u9").await.unwrap_err(),
            Refused::TimedOut
        );
        assert!(started.elapsed() >= Duration::from_millis(300));
        // ...while the agents' and leader election's seats are all there.
        for i in 0..5 {
            held.push(s.acquire(Level::System, &format!("c{i}")).await.unwrap());
        }
        held.push(s.acquire(Level::LeaderElection, "ctl").await.unwrap());
        assert_eq!(in_use(&s, Level::System), 5);
        drop(held);
        assert_eq!(s.stats().map(|(_, st)| st.in_use), [0, 0, 0]);
    }

    #[tokio::test]
    async fn agents_borrow_idle_seats_and_give_them_back_first() {
        let s = seats(10);
        let mut agents = Vec::new();
        // Every seat the others leave idle, and no more.
        for i in 0..10 {
            agents.push(s.acquire(Level::System, &format!("c{i}")).await.unwrap());
        }
        let s2 = s.clone();
        let user = tokio::spawn(async move { s2.acquire(Level::Workload, "alice").await });
        let s3 = s.clone();
        let another_agent = tokio::spawn(async move { s3.acquire(Level::System, "c99").await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(s.stats()[Level::Workload.index()].1.queued, 1);
        // The first seat freed goes to the user (its level is below its guarantee), not to
        // the agent queued after it.
        drop(agents.pop());
        let seat = user.await.unwrap().expect("the user's seat");
        assert_eq!(seat.level, Level::Workload);
        assert_eq!(s.stats()[Level::System.index()].1.queued, 1);
        drop(agents.pop());
        another_agent.await.unwrap().expect("the agent's seat");
    }

    #[tokio::test]
    async fn a_user_waits_behind_its_own_requests_not_in_front_of_others() {
        let s = Seats::new(10, 50, Duration::from_secs(5));
        // Workload has 4 seats; the flood takes them and queues 20 more.
        let mut flood_seats = Vec::new();
        for _ in 0..4 {
            flood_seats.push(s.acquire(Level::Workload, "flood").await.unwrap());
        }
        let order = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (s, order) = (s.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let seat = s.acquire(Level::Workload, "flood").await.unwrap();
                order.lock().push(format!("flood{i}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(seat);
            }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Bob comes last, and is served among the first, not after the whole flood.
        let (s2, order2) = (s.clone(), order.clone());
        let bob = tokio::spawn(async move {
            let seat = s2.acquire(Level::Workload, "bob").await.unwrap();
            order2.lock().push("bob".into());
            drop(seat);
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(flood_seats);
        bob.await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().clone();
        let at = order.iter().position(|o| o == "bob").unwrap();
        assert!(at <= 4, "bob served {at}th: {order:?}");
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once_and_a_gone_client_leaves_no_seat_behind() {
        let s = seats(10);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(s.acquire(Level::Workload, "u").await.unwrap());
        }
        let mut waiting = Vec::new();
        for _ in 0..3 {
            let s = s.clone();
            waiting.push(tokio::spawn(async move {
                s.acquire(Level::Workload, "u").await
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            s.acquire(Level::Workload, "u").await.unwrap_err(),
            Refused::QueueFull
        );
        // Another user's queue is its own.
        let s2 = s.clone();
        let other = tokio::spawn(async move { s2.acquire(Level::Workload, "v").await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Clients that give up leave their queue; a seat handed to one that is gone comes back.
        for w in &waiting {
            w.abort();
        }
        other.abort();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(s.stats()[Level::Workload.index()].1.queued, 0);
        drop(held);
        assert_eq!(s.stats().map(|(_, st)| st.in_use), [0, 0, 0]);
        let again: Vec<Seat> =
            futures_util::future::join_all((0..4).map(|_| s.acquire(Level::Workload, "w")))
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
        assert_eq!(again.len(), 4);
    }
}

//! A controller's inbox of changes: what its reflectors saw, each change tagged with the
//! source it came from, waiting until the controller takes it.
//!
//! Only the newest change of each object waits (as client-go's work queue keeps one entry per
//! key): a change to an object whose earlier change has not been taken yet replaces that
//! change in its place in line, and a listing of a source replaces every change of that
//! source still waiting. An object deleted and created again under its name is two objects
//! (their uids differ): both changes wait, in order. A controller that falls behind a busy source (a
//! fleet's heartbeats) thus holds at most one change per object, not every version since it
//! last looked; and since controllers reconcile against the newest state, never against the
//! event that woke them, nothing they decide on is lost.
//!
//! Like a channel: it ends for the receiver once every sender is gone and nothing waits, and
//! sending fails once the receiver is gone.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use tokio::sync::Notify;

use super::reflector::Event;

/// A new inbox: its senders (one per source, cloned) and its receiver.
pub fn inbox<S: Clone + Eq + Hash>() -> (InboxSender<S>, Inbox<S>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            next: 0,
            line: BTreeMap::new(),
            waiting: HashMap::new(),
            senders: 1,
            open: true,
        }),
        notify: Notify::new(),
    });
    (
        InboxSender {
            shared: shared.clone(),
        },
        Inbox { shared },
    )
}

#[derive(Debug)]
struct Shared<S> {
    state: Mutex<State<S>>,
    /// Wakes the receiver (one permit is kept when it is not waiting yet).
    notify: Notify,
}

#[derive(Debug)]
struct State<S> {
    next: u64,
    /// What waits, in the order it first arrived.
    line: BTreeMap<u64, (S, Event)>,
    /// Where each object's waiting change is in line, by (source, namespace/name).
    waiting: HashMap<(S, String), u64>,
    senders: usize,
    /// The receiver is still there.
    open: bool,
}

impl<S> Shared<S> {
    fn lock(&self) -> MutexGuard<'_, State<S>> {
        self.state.lock()
    }
}

fn key_of(ev: &Event) -> Option<String> {
    match ev {
        Event::Upsert(o) | Event::Delete(o) => {
            Some(format!("{}/{}", o.metadata.namespace, o.metadata.name))
        }
        Event::Listed(_) => None,
    }
}

/// Whether two changes are of one object, not of two that had the same name one after the
/// other: a deletion and the creation after it both reach the controller (one that keeps
/// owners by uid, the garbage collector, must see the first one go).
fn same_object(a: &Event, b: &Event) -> bool {
    match (a, b) {
        (Event::Upsert(x) | Event::Delete(x), Event::Upsert(y) | Event::Delete(y)) => {
            x.metadata.uid == y.metadata.uid
        }
        _ => false,
    }
}

/// The receiver is gone: nothing sent is taken any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the inbox's receiver is gone")]
pub struct Closed;

/// Why [`Inbox::try_recv`] returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryRecvError {
    /// Nothing waits now.
    Empty,
    /// Nothing waits, and every sender is gone.
    Disconnected,
}

/// Sends into an inbox; clone one for each source.
#[derive(Debug)]
pub struct InboxSender<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for InboxSender<S> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        InboxSender {
            shared: self.shared.clone(),
        }
    }
}

impl<S> Drop for InboxSender<S> {
    fn drop(&mut self) {
        let last = {
            let mut st = self.shared.lock();
            st.senders -= 1;
            st.senders == 0
        };
        if last {
            self.shared.notify.notify_one();
        }
    }
}

impl<S: Clone + Eq + Hash> InboxSender<S> {
    /// Puts a change in line, in place of the same object's change still waiting, if any.
    pub fn send(&self, (src, ev): (S, Event)) -> Result<(), Closed> {
        {
            let mut st = self.shared.lock();
            if !st.open {
                return Err(Closed);
            }
            match key_of(&ev) {
                Some(key) => {
                    let k = (src, key);
                    if let Some(seq) = st.waiting.get(&k).copied()
                        && let Some(slot) = st.line.get_mut(&seq)
                        && same_object(&slot.1, &ev)
                    {
                        slot.1 = ev;
                    } else {
                        let seq = st.next;
                        st.next += 1;
                        st.line.insert(seq, (k.0.clone(), ev));
                        st.waiting.insert(k, seq);
                    }
                }
                None => {
                    // A listing replaces whatever of its source still waits.
                    st.line.retain(|_, (s, _)| *s != src);
                    st.waiting.retain(|(s, _), _| *s != src);
                    let seq = st.next;
                    st.next += 1;
                    st.line.insert(seq, (src, ev));
                }
            }
        }
        self.shared.notify.notify_one();
        Ok(())
    }
}

/// Takes changes out of an inbox, oldest first.
#[derive(Debug)]
pub struct Inbox<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Drop for Inbox<S> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.open = false;
        st.line.clear();
        st.waiting.clear();
    }
}

impl<S: Clone + Eq + Hash> Inbox<S> {
    /// The oldest change waiting, without waiting for one.
    pub fn try_recv(&mut self) -> Result<(S, Event), TryRecvError> {
        let mut st = self.shared.lock();
        match st.line.pop_first() {
            Some((seq, (src, ev))) => {
                if let Some(key) = key_of(&ev) {
                    let k = (src.clone(), key);
                    // Unless a newer object of the name waits behind it.
                    if st.waiting.get(&k) == Some(&seq) {
                        st.waiting.remove(&k);
                    }
                }
                Ok((src, ev))
            }
            None if st.senders == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// The oldest change, once there is one; `None` once every sender is gone and nothing
    /// waits.
    pub async fn recv(&mut self) -> Option<(S, Event)> {
        loop {
            match self.try_recv() {
                Ok(x) => return Some(x),
                Err(TryRecvError::Disconnected) => return None,
                // A send after this check leaves a permit: the wait below ends at once.
                Err(TryRecvError::Empty) => self.shared.notify.notified().await,
            }
        }
    }

    /// How many changes wait.
    pub fn len(&self) -> usize {
        self.shared.lock().line.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A reflector's inbox: one source, so its changes come untagged.
#[derive(Debug)]
pub struct Events(Inbox<()>, super::reflector::Health);

impl Events {
    pub(crate) fn new(inbox: Inbox<()>, health: super::reflector::Health) -> Self {
        Events(inbox, health)
    }

    /// Whether the reflector is in step with the store (see [`super::reflector::Health`]).
    pub fn health(&self) -> super::reflector::Health {
        self.1.clone()
    }

    /// The oldest change, once there is one; `None` once the reflector ended.
    pub async fn recv(&mut self) -> Option<Event> {
        self.0.recv().await.map(|(_, ev)| ev)
    }

    /// The oldest change waiting, without waiting for one.
    pub fn try_recv(&mut self) -> Result<Event, TryRecvError> {
        self.0.try_recv().map(|(_, ev)| ev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orrery_api::Object;
    use serde_json::json;

    fn obj(name: &str, v: i64) -> Arc<Object> {
        obj_uid(name, v, name)
    }

    fn obj_uid(name: &str, v: i64, uid: &str) -> Arc<Object> {
        Arc::new(
            Object::from_value(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "data": {"v": v.to_string()},
            }))
            .expect("an object"),
        )
    }

    /// What each taken change is: (source, kind of change, name, version).
    fn describe((src, ev): (u8, Event)) -> (u8, &'static str, String, String) {
        let v = |o: &Object| {
            o.other
                .get("data")
                .and_then(|d| d.get("v"))
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        match ev {
            Event::Upsert(o) => (src, "upsert", o.metadata.name.clone(), v(&o)),
            Event::Delete(o) => (src, "delete", o.metadata.name.clone(), v(&o)),
            Event::Listed(items) => (src, "listed", String::new(), items.len().to_string()),
        }
    }

    fn take_all(rx: &mut Inbox<u8>) -> Vec<(u8, &'static str, String, String)> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(describe)
            .collect()
    }

    #[test]
    fn only_the_newest_change_of_an_object_waits_in_the_place_of_its_first() {
        let (tx, mut rx) = inbox::<u8>();
        let s = |src: u8, ev: Event| tx.send((src, ev)).expect("open");
        s(1, Event::Upsert(obj("a", 1)));
        s(1, Event::Upsert(obj("b", 1)));
        s(1, Event::Upsert(obj("a", 2)));
        // The same name from another source is another object.
        s(2, Event::Upsert(obj("a", 7)));
        s(1, Event::Delete(obj("b", 1)));
        s(1, Event::Upsert(obj("a", 3)));
        assert_eq!(rx.len(), 3);
        assert_eq!(
            take_all(&mut rx),
            vec![
                (1, "upsert", "a".into(), "3".into()),
                (1, "delete", "b".into(), "1".into()),
                (2, "upsert", "a".into(), "7".into()),
            ]
        );
        // Taken: the next change of it waits anew, behind what came meanwhile.
        s(1, Event::Upsert(obj("c", 1)));
        s(1, Event::Upsert(obj("a", 4)));
        assert_eq!(
            take_all(&mut rx),
            vec![
                (1, "upsert", "c".into(), "1".into()),
                (1, "upsert", "a".into(), "4".into()),
            ]
        );
    }

    #[test]
    fn an_object_deleted_and_created_again_is_two_objects() {
        let (tx, mut rx) = inbox::<u8>();
        let s = |ev: Event| tx.send((1, ev)).expect("open");
        s(Event::Upsert(obj_uid("a", 1, "u1")));
        s(Event::Delete(obj_uid("a", 1, "u1")));
        s(Event::Upsert(obj_uid("a", 2, "u2")));
        s(Event::Upsert(obj_uid("a", 3, "u2")));
        let first = rx.try_recv().map(describe);
        assert_eq!(first, Ok((1, "delete", "a".into(), "1".into())));
        // The newer object still waits as one entry, and takes its changes in place.
        s(Event::Upsert(obj_uid("a", 4, "u2")));
        assert_eq!(rx.len(), 1);
        assert_eq!(
            take_all(&mut rx),
            vec![(1, "upsert", "a".into(), "4".into())]
        );
    }

    #[test]
    fn a_listing_replaces_what_of_its_source_still_waits() {
        let (tx, mut rx) = inbox::<u8>();
        let s = |src: u8, ev: Event| tx.send((src, ev)).expect("open");
        s(1, Event::Upsert(obj("a", 1)));
        s(2, Event::Upsert(obj("x", 1)));
        s(1, Event::Listed(vec![obj("a", 1), obj("b", 1)]));
        s(1, Event::Upsert(obj("a", 2)));
        s(1, Event::Listed(vec![obj("a", 2)]));
        assert_eq!(
            take_all(&mut rx),
            vec![
                (2, "upsert", "x".into(), "1".into()),
                (1, "listed", String::new(), "1".into()),
            ]
        );
    }

    #[tokio::test]
    async fn it_ends_when_the_senders_are_gone_and_sending_fails_without_a_receiver() {
        let (tx, mut rx) = inbox::<u8>();
        let tx2 = tx.clone();
        let waiter = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(x) = rx.recv().await {
                got.push(describe(x));
            }
            got
        });
        tokio::task::yield_now().await;
        tx.send((1, Event::Upsert(obj("a", 1)))).expect("open");
        drop(tx);
        tokio::task::yield_now().await;
        tx2.send((2, Event::Upsert(obj("b", 1)))).expect("open");
        drop(tx2);
        let got = waiter.await.expect("the receiver ran");
        assert_eq!(
            got,
            vec![
                (1, "upsert", "a".into(), "1".into()),
                (2, "upsert", "b".into(), "1".into()),
            ]
        );

        let (tx, rx) = inbox::<u8>();
        drop(rx);
        assert_eq!(tx.send((1, Event::Upsert(obj("a", 1)))), Err(Closed));
    }
}

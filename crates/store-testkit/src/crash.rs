//! Writes run by another process that is killed with SIGKILL while it writes: the model test's
//! crash step. The parent sends the writes as JSON lines on the child's standard input (the
//! `store-writer script` mode); the child opens the store, runs them all concurrently, and
//! prints one answer line per write as its store acknowledges it; the parent kills it after a
//! given number of answers. A write without an answer may or may not have happened; one with
//! an answer must have, exactly as answered.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use orrery_api::Object;
use orrery_store::{Preconditions, Revision, Store, StoreError};
use serde::{Deserialize, Serialize};

/// One write of a crash step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrashWrite {
    pub key: String,
    pub op: CrashOp,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CrashOp {
    Create(Object),
    /// Unconditional.
    Update(Object),
    /// Without preconditions.
    Delete,
}

/// What the store answered to one write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrashOutcome {
    /// Acknowledged at this revision.
    Written(Revision),
    AlreadyExists,
    NotFound,
    Other(String),
}

impl CrashOutcome {
    fn line(&self, i: usize) -> String {
        match self {
            CrashOutcome::Written(rev) => format!("A {i} {rev}"),
            CrashOutcome::AlreadyExists => format!("E {i} exists"),
            CrashOutcome::NotFound => format!("E {i} notfound"),
            CrashOutcome::Other(msg) => format!("E {i} other {}", msg.replace('\n', " ")),
        }
    }

    fn parse(line: &str) -> Option<(usize, CrashOutcome)> {
        let mut parts = line.splitn(4, ' ');
        let tag = parts.next()?;
        let i: usize = parts.next()?.parse().ok()?;
        let what = parts.next()?;
        let outcome = match (tag, what) {
            ("A", rev) => CrashOutcome::Written(rev.parse().ok()?),
            ("E", "exists") => CrashOutcome::AlreadyExists,
            ("E", "notfound") => CrashOutcome::NotFound,
            ("E", "other") => CrashOutcome::Other(parts.next().unwrap_or_default().to_string()),
            _ => return None,
        };
        Some((i, outcome))
    }
}

/// The child's side: reads writes from standard input until it closes, runs them all at once,
/// and prints `ready` and then one answer per write.
pub async fn serve(store: Arc<dyn Store>) -> anyhow::Result<()> {
    let mut writes = Vec::new();
    for line in std::io::stdin().lock().lines() {
        writes.push(serde_json::from_str::<CrashWrite>(&line?)?);
    }
    let out = Arc::new(parking_lot::Mutex::new(std::io::stdout()));
    let say = move |line: String| {
        let mut o = out.lock();
        let _ = writeln!(o, "{line}");
        let _ = o.flush();
    };
    say("ready".into());
    let mut tasks = Vec::new();
    for (i, w) in writes.into_iter().enumerate() {
        let (store, say) = (store.clone(), say.clone());
        tasks.push(tokio::spawn(async move {
            let answer = match w.op {
                CrashOp::Create(o) => store.create(&w.key, o).await,
                CrashOp::Update(o) => store.update(&w.key, o, None).await,
                CrashOp::Delete => store.delete(&w.key, &Preconditions::default()).await,
            };
            let outcome = match answer {
                Ok(o) => CrashOutcome::Written(o.revision().unwrap_or_default()),
                Err(StoreError::AlreadyExists { .. }) => CrashOutcome::AlreadyExists,
                Err(StoreError::NotFound { .. }) => CrashOutcome::NotFound,
                Err(e) => CrashOutcome::Other(e.to_string()),
            };
            say(outcome.line(i));
        }));
    }
    for t in tasks {
        t.await?;
    }
    // Stay up until killed, so the parent decides when the process dies.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(())
}

/// The parent's side: runs `writer args...` with `writes`, and kills it with SIGKILL after
/// `kill_after` answers (at once after `ready` for 0). Returns the answers read.
pub fn run_script(
    writer: &Path,
    args: &[String],
    writes: &[CrashWrite],
    kill_after: usize,
) -> Vec<(usize, CrashOutcome)> {
    let mut child = Command::new(writer)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", writer.display()));
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        for w in writes {
            let line = serde_json::to_string(w).expect("a crash write serializes");
            writeln!(stdin, "{line}").expect("send a write to the crash writer");
        }
    }
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut answers = Vec::new();
    let mut ready = false;
    while !ready || answers.len() < kill_after.min(writes.len()) {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line == "ready" => ready = true,
            Ok(line) => answers.extend(CrashOutcome::parse(&line)),
            Err(e) => {
                let _ = child.kill();
                panic!("the crash writer stopped talking: {e}")
            }
        }
    }
    child.kill().expect("SIGKILL the crash writer");
    child.wait().expect("reap the crash writer");
    reader.join().expect("the reader thread ends with the pipe");
    // Answers printed before the kill count too; a line cut short by it parses as nothing.
    answers.extend(rx.try_iter().filter_map(|l| CrashOutcome::parse(&l)));
    answers
}

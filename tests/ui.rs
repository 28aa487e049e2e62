//! The global view in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by the test command) driven over WebDriver. The page shows
//! nothing without a token; with one it shows every cluster with its water level, a workload
//! applied during the test appears with its placement without a reload (so do workloads no
//! policy selects, and replicas that fit nowhere), the chart draws a line per cluster over
//! labelled axes, the schedule history and the workloads name the same strategy, and a
//! cluster's outage is one failure with its recovery, shown stale and marked on the time axis,
//! and a deleted cluster leaves the view. Every tab is checked and saved as a screenshot at
//! 1600 and 800 px, as the fleet is, during an outage and after a cluster is deleted.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::fleet::Fleet;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromedriver() -> (Driver, u16) {
    let port = common::free_port();
    let bin = std::env::var("ORRERY_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    let child = Command::new(&bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {bin} ({e}); ./scripts/test installs chromium-driver")
        });
    (Driver(child), port)
}

async fn browser(port: u16) -> Client {
    let chrome = std::env::var("ORRERY_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chrome,
            // The server's certificate is from its own CA, on loopback.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--ignore-certificate-errors", "--window-size=1366,900"],
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("chromedriver did not take a session: {e}"),
        }
    }
}

/// Waits until `script` (which returns a boolean) is true in the page.
async fn until(c: &Client, what: &str, script: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = c.execute(script, vec![]).await.unwrap();
        if v.as_bool() == Some(true) {
            return;
        }
        if Instant::now() > deadline {
            // What the reader sees says more than the markup.
            let text = c
                .execute("return document.body.innerText", vec![])
                .await
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            panic!(
                "timed out waiting for {what}:\n{}",
                &text[..text.len().min(6000)]
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens a tab of the global view (`fleet`, `workloads`, `schedules`, `failures`).
async fn open_tab(c: &Client, tab: &str) {
    c.find(Locator::Id(&format!("tab-{tab}")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: shop, namespace: default}
spec:
  replicas: 6
  selector: {matchLabels: {app: shop}}
  template:
    metadata: {labels: {app: shop}}
    spec:
      containers:
      - {name: shop, image: nginx:1.25, resources: {requests: {cpu: 250m, memory: 128Mi}}}
---
apiVersion: multicluster.io/v1alpha1
kind: ResourcePlacementPolicy
metadata: {name: shop, namespace: default}
spec:
  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: shop, namespace: default}
  placement:
    replicaScheduling: {replicaSchedulingType: Divided}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_view_shows_the_fleet_live() {
    let f = Fleet::start_with(
        &[
            ("east", "us-east"),
            ("west", "us-west"),
            ("europe", "eu-west"),
        ],
        &[
            "--monitoring-interval",
            "1s",
            "--cluster-grace-period",
            "2s",
            // A "day" of 20 seconds: forecasts within seconds, drawn after the history.
            "--forecast-season",
            "20s",
            "--forecast-horizon",
            "10s",
        ],
    );
    let url = f.s.url.clone();
    let kubeconfig = std::fs::read_to_string(&f.s.kubeconfig).unwrap();
    let token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().to_string())
        .unwrap();
    let (_driver, port) = chromedriver();
    let c = browser(port).await;

    // Without a token: the login form, and no data at all.
    c.goto(&format!("{url}/ui")).await.unwrap();
    until(
        &c,
        "the login form",
        "return !document.getElementById('login').hidden",
    )
    .await;
    let shown = c
        .execute(
            "return [document.getElementById('app').hidden, document.querySelectorAll('#clusters tbody tr').length]",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(shown, json!([true, 0]), "nothing without a token");
    // A wrong token is refused.
    c.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys("not-a-token")
        .await
        .unwrap();
    c.find(Locator::Css("#login-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(
        &c,
        "the refusal",
        "return document.getElementById('login-err').textContent.length > 0",
    )
    .await;

    // The login link `orrery up` prints: every cluster with its water level.
    let started = Instant::now();
    c.goto(&format!("{url}/ui#token={token}")).await.unwrap();
    until(
        &c,
        "three clusters with water levels",
        "const rows = [...document.querySelectorAll('#clusters tbody tr')];
         return rows.length === 3 && rows.every(r => r.querySelector('td[data-level]').dataset.level !== '');",
    )
    .await;
    let first_render_ms = started.elapsed().as_millis();
    let names = c
        .execute(
            "return [...document.querySelectorAll('#clusters tbody tr')].map(r => r.dataset.cluster)",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(names, json!(["east", "europe", "west"]));
    // The token does not stay in the address bar.
    assert!(!c.current_url().await.unwrap().as_str().contains("token"));

    // A workload applied now appears, with its placement, without a reload.
    open_tab(&c, "workloads").await;
    c.execute("window.__marker = 42", vec![]).await.unwrap();
    f.s.apply(WEB);
    until(
        &c,
        "the workload with its placement",
        "const r = document.querySelector('#workloads tr[data-workload=\"default/shop\"]');
         return !!r && r.querySelectorAll('.chip').length > 0;",
    )
    .await;
    let same_page = c.execute("return window.__marker", vec![]).await.unwrap();
    assert_eq!(same_page, json!(42), "the page was not reloaded");
    // What its replicas cost (the members' prices), now and over time.
    until(
        &c,
        "the fleet's hourly cost and its line",
        "const v = Number(document.getElementById('s-cost').textContent);
         return v > 0 && !!document.querySelector('#cost-spark .cost-line');",
    )
    .await;
    // READY sums what the members report.
    until(
        &c,
        "the workload's ready replicas",
        "const r = document.querySelector('#workloads tr[data-workload=\"default/shop\"] td[data-ready]');
         return !!r && r.dataset.ready === '6/6';",
    )
    .await;
    // A Job ends: Completed, not Running, once every cluster's copy completed.
    f.s.apply(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: once, namespace: default}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox}]\n---\napiVersion: multicluster.io/v1alpha1\nkind: ResourcePlacementPolicy\nmetadata: {name: once, namespace: default}\nspec:\n  resourceSelector: {apiVersion: batch/v1, kind: Job, name: once, namespace: default}\n  placement: {clusterAffinity: {clusterNames: [east]}}\n",
    );
    until(
        &c,
        "the Job completed",
        "const r = document.querySelector('#workloads tr[data-workload=\"default/once\"]');
         return !!r && r.lastElementChild.textContent === 'Completed';",
    )
    .await;
    // A workload no policy selects is listed, and says why it runs nowhere.
    f.s.apply(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: lonely, namespace: default}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: lonely}}\n  template:\n    metadata: {labels: {app: lonely}}\n    spec:\n      containers: [{name: c, image: nginx}]\n",
    );
    until(
        &c,
        "the unselected workload",
        "const r = document.querySelector('#workloads tr[data-workload=\"default/lonely\"]');
         return !!r && r.lastElementChild.textContent === 'NoPlacementPolicy' && r.children[2].textContent === '2';",
    )
    .await;
    // Replicas that fit nowhere are counted.
    f.s.apply(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: huge, namespace: default}\nspec:\n  replicas: 500\n  selector: {matchLabels: {app: huge}}\n  template:\n    metadata: {labels: {app: huge}}\n    spec:\n      containers: [{name: c, image: nginx, resources: {requests: {cpu: '2'}}}]\n---\napiVersion: multicluster.io/v1alpha1\nkind: ResourcePlacementPolicy\nmetadata: {name: huge, namespace: default}\nspec:\n  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: huge, namespace: default}\n  placement:\n    replicaScheduling: {replicaSchedulingType: Divided}\n",
    );
    until(
        &c,
        "the unplaced replicas",
        // The fleet's 96 cores hold few of 500 two-core replicas (how few depends on what its
        // forecasts say by then): what is not placed is said, and adds up with what is.
        "const r = document.querySelector('#workloads tr[data-workload=\"default/huge\"]');
         if (!r) return false;
         const m = / · (\\d+) unplaced$/.exec(r.lastElementChild.textContent);
         if (!m) return false;
         const placed = [...r.children[4].textContent.matchAll(/×(\\d+)/g)]
             .reduce((s, x) => s + Number(x[1]), 0);
         return placed < 500 && Number(m[1]) === 500 - placed;",
    )
    .await;
    // A Migration shows up live, with its phase and why (a Deployment without volumes has
    // no data to move: refused at once).
    f.s.apply(
        "apiVersion: multicluster.io/v1alpha1\nkind: Migration\nmetadata: {name: shop-move, namespace: default}\nspec:\n  resource: {apiVersion: apps/v1, kind: Deployment, name: shop}\n",
    );
    until(
        &c,
        "the migration and its outcome",
        "const r = document.querySelector('#migrations tr[data-migration=\"default/shop-move\"]');
         return !!r && r.dataset.phase === 'Failed' && r.querySelector('td[title]').title.includes('no data to move');",
    )
    .await;

    // The schedule history, with the decision's reasons.
    open_tab(&c, "schedules").await;
    until(
        &c,
        "the decision in the history",
        "return [...document.querySelectorAll('#schedules tbody tr')].some(r => r.textContent.includes('default/shop-deployment'))",
    )
    .await;
    // The strategy of the decision in force reads the same on both tabs, and the history
    // holds decisions, not repeats of the same one.
    let (history_strategy, workload_strategy, repeats) = {
        let v = c
            .execute(
                "const rows = [...document.querySelectorAll('#schedules tbody tr')].filter(r => r.children[1].textContent === 'default/shop-deployment');
                 const key = (r) => [3, 4].map(i => r.children[i].textContent).join('|') + '|' + r.children[5].firstChild.textContent;
                 let repeats = 0;
                 for (let i = 1; i < rows.length; i++) if (key(rows[i]) === key(rows[i - 1])) repeats++;
                 const w = document.querySelector('#workloads tr[data-workload=\"default/shop\"]');
                 return [rows[0].children[4].textContent, w.children[5].textContent, repeats];",
                vec![],
            )
            .await
            .unwrap();
        (v[0].clone(), v[1].clone(), v[2].clone())
    };
    assert_eq!(history_strategy, workload_strategy);
    assert_eq!(repeats, json!(0));
    // Keyboard: the tabs are buttons that take focus.
    let focusable = c
        .execute(
            "const b = document.getElementById('tab-failures'); b.focus(); return document.activeElement === b",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(focusable, json!(true));

    // The chart: a line per cluster, named in the legend, over labelled axes.
    open_tab(&c, "fleet").await;
    until(
        &c,
        "a line per cluster with axes",
        "const lines = new Set([...document.querySelectorAll('#chart .cluster-line')].map(l => l.dataset.cluster));
         const legend = [...document.querySelectorAll('#chart-legend li[data-cluster]')].map(l => l.dataset.cluster);
         const texts = [...document.querySelectorAll('#chart text')].map(t => t.textContent);
         return lines.size === 3 && legend.join() === 'east,europe,west'
             && texts.includes('100%') && texts.includes('0%')
             && document.querySelectorAll('#chart text.x-label').length >= 2;",
    )
    .await;
    // Each cluster's forecast after its history, right of the present: its mean for every
    // cluster, its 80 % interval only for the one picked in the legend (bands of all hid the
    // lines), and nothing drawn outside the plot.
    until(
        &c,
        "a forecast mean per cluster after the history, and no band until one is picked",
        "const means = [...document.querySelectorAll('#chart .forecast-mean')];
         const now = document.querySelector('#chart line.now');
         if (new Set(means.map(m => m.dataset.cluster)).size !== 3 || !now) return false;
         const x = Number(now.getAttribute('x1'));
         const xs = b => b.getAttribute('points').split(' ').map(p => Number(p.split(',')[0]));
         return means.every(m => Math.max(...xs(m)) > x + 10)
             && document.querySelectorAll('#chart .forecast-band').length === 0
             && document.getElementById('chart-note').textContent.includes('80 % interval');",
    )
    .await;
    c.find(Locator::Css(
        "#chart-legend li[data-cluster=\"east\"] button",
    ))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    until(
        &c,
        "east's band alone, clipped to the plot",
        "const bands = [...document.querySelectorAll('#chart .forecast-band')];
         return bands.length === 1 && bands[0].dataset.cluster === 'east'
             && bands[0].closest('g[clip-path]') !== null
             && document.querySelector('#chart-legend li[data-cluster=\"east\"] button').getAttribute('aria-pressed') === 'true';",
    )
    .await;
    // Axes with titles; time ticks on round times (multiples of 15 s); lines told apart by
    // markers of their own shape; levels as percentages; pods as counts.
    let look = c
        .execute(
            "const titles = [...document.querySelectorAll('#chart text.axis-title')].map(t => t.textContent);
             const ticks = [...document.querySelectorAll('#chart text.x-label')].map(t => Number(t.dataset.t));
             const shapes = {};
             for (const m of document.querySelectorAll('#chart .marker')) shapes[m.dataset.cluster] = m.tagName;
             const cells = [...document.querySelectorAll('#clusters tbody td')].map(t => t.textContent);
             return [titles.length, ticks.length >= 2 && ticks.every(t => t % 15000 === 0),
                     new Set(Object.values(shapes)).size, Object.keys(shapes).length,
                     cells.some(t => /\\b0\\.\\d\\d\\b/.test(t)), cells.filter(t => / of \\d+$/.test(t)).length,
                     document.getElementById('s-level').textContent.includes('%')];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(look, json!([2, true, 3, 3, false, 3, true]), "{look}");
    // Tables grow with the page: no box of their own to scroll in.
    let boxed = c
        .execute(
            "return [...document.querySelectorAll('.scroll')].map(s => getComputedStyle(s).maxHeight).filter(h => h !== 'none')",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(boxed, json!([]));

    // Every tab at two widths, as the fleet is, in an outage and after a cluster is deleted:
    // nothing runs off the page or out of its table, and each is kept as a screenshot with
    // the test output.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let shots = |when: &'static str| {
        let c = c.clone();
        let dir = dir.clone();
        async move {
            for width in [1600u32, 800] {
                c.set_window_size(width, 1000).await.unwrap();
                for tab in ["fleet", "workloads", "schedules", "failures"] {
                    open_tab(&c, tab).await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let overflow = c
                        .execute(
                            "const out = [];
                             if (document.documentElement.scrollWidth > window.innerWidth) out.push('page ' + document.documentElement.scrollWidth + ' > ' + window.innerWidth);
                             for (const s of document.querySelectorAll('section.panel:not([hidden]) .scroll'))
                               if (s.scrollWidth > s.clientWidth + 1) out.push(s.firstElementChild.id + ' ' + s.scrollWidth + ' > ' + s.clientWidth);
                             return out;",
                            vec![],
                        )
                        .await
                        .unwrap();
                    assert_eq!(overflow, json!([]), "{when}: {tab} at {width} px");
                    let png = c.screenshot().await.unwrap();
                    assert!(png.len() > 1000);
                    std::fs::write(dir.join(format!("{when}-{tab}-{width}.png")), &png).unwrap();
                }
            }
            c.set_window_size(1366, 900).await.unwrap();
            open_tab(&c, "fleet").await;
        }
    };
    shots("fleet").await;

    // A rollout stage by stage: revision 2 never becomes ready, so its first stage halts (in
    // red), its cluster failed, and the other stage not touched.
    let rolled = |image: &str, bad: bool| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: rolled, namespace: default}}\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: rolled}}}}\n  template:\n    metadata: {{labels: {{app: rolled}}, annotations: {{\"sim.orrery.io/never-ready\": \"{bad}\"}}}}\n    spec:\n      containers: [{{name: c, image: {image}}}]\n"
        )
    };
    f.s.ok(&["label", "cluster", "east", "ring=first"]);
    f.s.apply(&rolled("web:1", false));
    f.s.apply(
        "apiVersion: policy.karmada.io/v1alpha1\nkind: PropagationPolicy\nmetadata: {name: rolled, namespace: default}\nspec:\n  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment, name: rolled}]\n  placement:\n    clusterAffinity: {clusterNames: [east, europe]}\n    rollout:\n      progressDeadline: 3s\n      stages:\n      - {name: first, clusterSelector: {matchLabels: {ring: first}}}\n      - {name: rest, percent: 100}\n",
    );
    open_tab(&c, "workloads").await;
    until(
        &c,
        "revision 1 rolled out",
        "const row = document.querySelector('#rollouts tr[data-rollout=\"default/rolled\"]');
         return !!row && row.querySelector('[data-phase]').dataset.phase === 'Complete';",
    )
    .await;
    f.s.apply(&rolled("web:2", true));
    until(
        &c,
        "revision 2 halted in its first stage, in red, the rest untouched",
        "const row = document.querySelector('#rollouts tr[data-rollout=\"default/rolled\"]');
         if (!row) return false;
         const first = row.querySelector('[data-stage=\"first\"]'), rest = row.querySelector('[data-stage=\"rest\"]');
         const east = row.querySelector('[data-cluster=\"east\"]');
         const europe = row.querySelector('[data-cluster=\"europe\"]');
         if (!first || !east || !europe) return false;
         return row.querySelector('[data-phase]').dataset.phase === 'Halted'
             && first.dataset.state === 'Halted' && first.classList.contains('t-bad')
             && (!rest || rest.dataset.state === 'Pending') && europe.textContent.endsWith('r1')
             && east.dataset.state === 'Failed' && east.classList.contains('t-bad');",
    )
    .await;
    shots("rollouts").await;
    // The schedule history tells each step: the stage's start, the cluster's failure, the
    // halt (in red).
    open_tab(&c, "schedules").await;
    until(
        &c,
        "the rollout's steps in the schedule history",
        "const ev = (e) => document.querySelector(`#schedules td[data-rollout-event=\"${e}\"]`);
         return !!ev('StageStarted') && !!ev('RolloutHalted') && ev('RolloutHalted').classList.contains('t-bad');",
    )
    .await;
    open_tab(&c, "fleet").await;

    // A cluster that goes dark: its last figures greyed and dated, no forecast, its outage
    // marked on the time axis, its pods not counted as running; then one failure, with its
    // recovery.
    f.s.apply(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: pinned, namespace: default}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: pinned}}\n  template:\n    metadata: {labels: {app: pinned}}\n    spec:\n      containers: [{name: c, image: nginx}]\n---\napiVersion: multicluster.io/v1alpha1\nkind: ResourcePlacementPolicy\nmetadata: {name: pinned, namespace: default}\nspec:\n  resourceSelector: {apiVersion: apps/v1, kind: Deployment, name: pinned, namespace: default}\n  placement: {clusterAffinity: {clusterNames: [west]}}\n",
    );
    let realtime = || -> serde_json::Value {
        let out = f.s.kubectl(&["get", "--raw", "/api/v1/monitor/realtime"]);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    common::eventually(Duration::from_secs(30), "pods running in west", || {
        realtime()["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "west" && c["pods"].as_i64() >= Some(2))
    });
    let admin = f.admin("west").to_string();
    let (code, body) = common::http(
        "PUT",
        &admin,
        "/clusters/west/faults",
        r#"{"outage": true}"#,
    );
    assert_eq!(code, 200, "{body}");
    common::eventually(
        Duration::from_secs(30),
        "west's pods counted apart, not as running",
        || {
            let rt = realtime();
            let cs = rt["clusters"].as_array().unwrap();
            let sum = |ready: bool| -> i64 {
                cs.iter()
                    .filter(|c| c["ready"] == ready)
                    .map(|c| c["pods"].as_i64().unwrap_or(0))
                    .sum()
            };
            cs.iter()
                .any(|c| c["name"] == "west" && c["ready"] == false)
                && rt["totalPods"].as_i64() == Some(sum(true))
                && rt["unreachablePods"].as_i64() == Some(sum(false))
                && sum(false) >= 2
        },
    );
    until(
        &c,
        "west shown stale, without a forecast, its outage on the time axis",
        "const row = document.querySelector('#clusters tr[data-cluster=\"west\"]');
         return !!row && row.dataset.ready !== 'True' && row.classList.contains('stale')
             && row.querySelector('.stale-note') !== null
             && document.querySelector('#chart-legend li[data-cluster=\"west\"]').dataset.stale === 'true'
             && !document.querySelector('#chart .forecast-mean[data-cluster=\"west\"]')
             && !!document.querySelector('#chart .event[data-kind=\"outage\"][data-cluster=\"west\"]')
             && /^\\(\\+\\d+ last known/.test(document.getElementById('s-pods-dark').textContent);",
    )
    .await;
    shots("outage").await;
    open_tab(&c, "failures").await;
    until(
        &c,
        "west's failure, not yet recovered",
        "return [...document.querySelectorAll('#failures tbody tr[data-cluster=\"west\"]')].some(r => r.lastElementChild.dataset.recovered === 'false')",
    )
    .await;
    let (code, body) = common::http("DELETE", &admin, "/clusters/west/faults", "");
    assert_eq!(code, 200, "{body}");
    until(
        &c,
        "west's failure with its recovery, and no recovery listed as a failure",
        "const rows = [...document.querySelectorAll('#failures tbody tr[data-cluster=\"west\"]')];
         return rows.length > 0 && rows.every(r => r.lastElementChild.dataset.recovered === 'true')
             && !rows.some(r => r.children[2].textContent === 'ClusterRecovered');",
    )
    .await;

    // A deleted cluster leaves the table, the chart and its legend; the others keep their
    // colours.
    open_tab(&c, "fleet").await;
    let colour = "return document.querySelector('#chart .cluster-line[data-cluster=\"west\"]').getAttribute('stroke')";
    let before = c.execute(colour, vec![]).await.unwrap();
    let out = f.s.kubectl(&["delete", "cluster", "europe"]);
    assert!(out.status.success(), "{out:?}");
    until(
        &c,
        "europe gone from the table, the chart and the legend",
        "return !document.querySelector('#clusters tr[data-cluster=\"europe\"]')
             && !document.querySelector('#chart-legend li[data-cluster=\"europe\"]')
             && !document.querySelector('#chart :is(.cluster-line, .marker, .forecast-mean, .forecast-band)[data-cluster=\"europe\"]')
             && document.querySelectorAll('#chart-legend li[data-cluster]').length === 2;",
    )
    .await;
    assert_eq!(c.execute(colour, vec![]).await.unwrap(), before);
    shots("deleted").await;

    // A fleet of 1,000: the figure is recorded (docs/benchmarks.md), not asserted.
    let kc = f.s.client().await;
    let mut jobs = Vec::new();
    for i in 0..998 {
        let kc = kc.clone();
        jobs.push(async move {
            let body = serde_json::to_vec(&json!({
                "apiVersion": "multicluster.io/v1alpha1", "kind": "Cluster",
                "metadata": {"name": format!("fleet-{i:04}")}, "spec": {"region": "sim"}}))
            .unwrap();
            kc.request_text(common::req(
                "POST",
                "/apis/multicluster.io/v1alpha1/clusters",
                "application/json",
                serde_json::from_slice(&body).unwrap(),
            ))
            .await
            .unwrap();
        });
        if jobs.len() == 32 {
            futures_util::future::join_all(std::mem::take(&mut jobs)).await;
        }
    }
    futures_util::future::join_all(jobs).await;
    c.goto("about:blank").await.unwrap();
    c.goto(&format!("{url}/ui#token={token}")).await.unwrap();
    let mut render_ms = 0.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let v = c
            .execute(
                "return [document.querySelectorAll('#clusters tbody tr').length, performance.now()]",
                vec![],
            )
            .await
            .unwrap();
        if v[0].as_u64() == Some(1000) {
            render_ms = v[1].as_f64().unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(render_ms > 0.0, "1,000 clusters never rendered");
    eprintln!("global view: 1,000 clusters rendered {render_ms:.0} ms after navigation");

    let png = c.screenshot().await.unwrap();
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-schedule-history.png");
    std::fs::write(&out, &png).unwrap();
    assert!(png.len() > 1000);
    eprintln!(
        "global view: first render of the fleet {first_render_ms} ms; screenshot {}",
        out.display()
    );
    c.close().await.unwrap();
}

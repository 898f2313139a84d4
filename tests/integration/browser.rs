//! End to end with real headless Chromium: the page served by the coordinator, the wasm
//! worker in a Web Worker, real WebSockets. `scripts/test.sh` builds `web/pkg` first.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

use server::Status;

use crate::util::*;

/// One headless Chromium process showing one page; killed (tab closed) on drop.
pub struct Browser {
    child: tokio::process::Child,
    _profile: tempfile::TempDir,
    /// Chrome DevTools Protocol port, when opened with one.
    devtools: Option<u16>,
}

impl Browser {
    pub fn open(url: &str) -> Self {
        Self::launch(url, None)
    }

    /// Opens `url` with the DevTools protocol on a free port, so the test can drive the tab.
    pub fn open_with_devtools(url: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        Self::launch(url, Some(port))
    }

    fn launch(url: &str, devtools: Option<u16>) -> Self {
        let pkg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../web/pkg/worker_wasm_bg.wasm");
        assert!(
            pkg.exists(),
            "{} is missing: build the browser worker first (scripts/test.sh does: \
             wasm-pack build --target web --release --out-dir ../web/pkg worker-wasm)",
            pkg.display()
        );
        let profile = tempfile::tempdir().expect("profile dir");
        let chrome = std::env::var("CHROME").unwrap_or_else(|_| "chromium".into());
        let child = tokio::process::Command::new(&chrome)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                // WebGPU on a machine without a GPU: SwiftShader, a fallback adapter, which
                // a page uses only when asked (`?gpu=fallback`).
                "--enable-unsafe-webgpu",
                "--window-size=1280,1100",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(devtools.map(|p| format!("--remote-debugging-port={p}")))
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {chrome} (apt-get install chromium): {e}"));
        Self {
            child,
            _profile: profile,
            devtools,
        }
    }

    /// Reloads the page through the DevTools protocol (as pressing F5 would).
    pub async fn reload(&self) {
        self.cdp("Page.reload", serde_json::json!({})).await;
    }

    /// Evaluates a JavaScript expression in the page and returns its value.
    pub async fn evaluate(&self, expression: &str) -> serde_json::Value {
        let params = serde_json::json!({"expression": expression, "returnByValue": true});
        let reply = self.cdp("Runtime.evaluate", params).await;
        reply["result"]["result"]["value"].clone()
    }

    /// A PNG of what the page shows.
    pub async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let reply = self
            .cdp(
                "Page.captureScreenshot",
                serde_json::json!({"format": "png"}),
            )
            .await;
        let data = reply["result"]["data"].as_str().expect("image data");
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64")
    }

    /// Waits until `expression` evaluates to `true` in the page, checking every 100 ms (and
    /// first, until Chromium's DevTools endpoint is up).
    pub async fn until(&self, what: &str, expression: &str) {
        let port = self.devtools.expect("opened with devtools");
        guard("DevTools to listen", async {
            while tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
        .await;
        guard(what, async {
            while self.evaluate(expression).await != serde_json::Value::Bool(true) {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
        .await;
    }

    /// Sends one DevTools command to the page and returns its reply.
    async fn cdp(&self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use futures_util::{SinkExt, StreamExt};
        let port = self.devtools.expect("opened with devtools");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let (code, _, body) = http_get_with(addr, "/json/list", "HTTP/1.1").await;
        assert_eq!(code, 200);
        let targets: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let page = targets
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .expect("a page target");
        let url = page["webSocketDebuggerUrl"].as_str().expect("debugger url");
        let (mut cdp, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("cdp connects");
        let cmd = serde_json::json!({"id": 1, "method": method, "params": params});
        cdp.send(cmd.to_string().into()).await.expect("send");
        loop {
            let msg = guard("a DevTools reply", cdp.next())
                .await
                .expect("cdp open")
                .expect("cdp frame");
            let reply: serde_json::Value =
                serde_json::from_str(msg.to_text().unwrap_or("{}")).unwrap_or_default();
            if reply["id"] == 1 {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply;
            }
        }
    }

    /// Closes the tab abruptly, as a volunteer closing the window would.
    pub async fn close(mut self) {
        self.child.kill().await.expect("kill chromium");
    }
}

pub fn page(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

/// Every worker is a tab, and every one sent gradients.
fn only_tabs_all_contributing(s: &Status) {
    assert_eq!(
        browsers(s),
        s.workers,
        "only browser workers: {:?}",
        s.worker_list
    );
    assert!(
        s.worker_list.iter().all(|w| w.gradients > 0),
        "every tab contributed"
    );
}

fn browsers(s: &Status) -> usize {
    s.worker_list.iter().filter(|w| w.kind == "browser").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tabs_train_to_90_percent_and_survive_a_closed_tab() {
    let _heavy = heavy().await;
    let server = start_server(&["--eval-interval", "10"]).await;
    let mut status = server.status.clone();
    let first = Browser::open(&page(server.addr));
    let second = Browser::open(&page(server.addr));
    wait_status(&mut status, "both tabs to join", |s| browsers(s) == 2).await;
    let started = Instant::now();
    let start_round = status.borrow().round;

    let s = wait_status(&mut status, "90 % test accuracy from the tabs", |s| {
        s.test_accuracy.is_some_and(|a| a >= 0.90)
    })
    .await;
    println!(
        "two tabs: {:.1} % test accuracy at round {} ({} rounds since both joined), {:.1} s",
        s.test_accuracy.unwrap_or_default() * 100.0,
        s.round,
        s.round - start_round,
        started.elapsed().as_secs_f64()
    );
    only_tabs_all_contributing(&s);

    // Close one tab mid-training: rounds keep completing with the other.
    first.close().await;
    let s = wait_status(&mut status, "the closed tab to leave", |s| s.workers == 1).await;
    let after_close = s.round;
    let s = wait_status(&mut status, "rounds to keep completing", |s| {
        s.round >= after_close + 20
    })
    .await;
    assert_eq!(browsers(&s), 1);

    second.close().await;
    stop(server).await;
}

/// The `cnn` preset in two tabs, alone, to 98 % on the embedded MNIST: the conv layers
/// run as wasm in the browser, and the page says what is being trained. Every answer is
/// recomputed (`--verify-fraction 1`) and none is flagged: where wasm's float order flips a
/// ReLU or a max-pool against the coordinator's, a near-tie explains it.
#[ignore = "a benchmark, not a test: bench/long-runs.sh cnn-tabs-98"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tabs_train_the_cnn_to_98_percent() {
    let _heavy = heavy().await;
    let flags = [
        "--model",
        "cnn",
        "--eval-interval",
        "20",
        "--target-accuracy",
        "0.98",
        "--max-rounds",
        "5000",
        "--min-workers",
        "2",
        "--verify-fraction",
        "1",
    ];
    let server = start_server(&flags).await;
    let mut status = server.status.clone();
    let first = Browser::open_with_devtools(&page(server.addr));
    let second = Browser::open(&page(server.addr));
    wait_status(&mut status, "both tabs to join", |s| browsers(s) == 2).await;
    first
        .until(
            "the page to name the model",
            "document.getElementById('model').textContent.startsWith('cnn, 80,202 parameters')",
        )
        .await;
    let started = Instant::now();
    follow(
        &mut status,
        100,
        5000,
        "98 %",
        |s| s.test_accuracy.is_some_and(|a| a >= 0.98),
        |_| {},
    )
    .await;
    let summary = guard("the run to stop at its target", server.wait())
        .await
        .expect("ran");
    let s = status.borrow().clone();
    println!(
        "two tabs, cnn: {:.2} % test accuracy at round {}, {:.1} s; tabs' samples/s: {:?}",
        summary.test_accuracy.unwrap_or_default() * 100.0,
        summary.rounds,
        started.elapsed().as_secs_f64(),
        s.worker_list
            .iter()
            .map(|w| w.samples_per_sec)
            .collect::<Vec<_>>()
    );
    assert!(summary.reached_target, "{summary:?}");
    only_tabs_all_contributing(&s);
    let rounds = summary.rounds;
    assert_never_flagged("cnn tabs", &s, rounds, 2, rounds);
    first.close().await;
    second.close().await;
}

/// Two tabs alone on `model_flags`, every answer recomputed, for `rounds` rounds (the short
/// form of a long run of `bench/long-runs.sh`): the training loss of the last three updates
/// is below that of the first three (from `/api/history`, read before the run ends), the
/// run's final test loss is below the first updates' training loss, both tabs contributed,
/// and nobody was struck.
async fn two_tabs_loss_falls(model_flags: &[&str], rounds: u64) -> Status {
    let rounds_flag = rounds.to_string();
    let mut flags = model_flags.to_vec();
    flags.extend([
        "--min-workers",
        "2",
        "--verify-fraction",
        "1",
        "--max-rounds",
        &rounds_flag,
    ]);
    let server = start_server(&flags).await;
    let mut status = server.status.clone();
    let first = Browser::open(&page(server.addr));
    let second = Browser::open(&page(server.addr));
    wait_status(&mut status, "all but the last round", |s| {
        s.round + 1 >= rounds
    })
    .await;
    let (code, _, body) = http_get(server.addr, "/api/history").await;
    assert_eq!(code, 200);
    let history: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let losses: Vec<f64> = history
        .as_array()
        .expect("points")
        .iter()
        .filter_map(|p| p["train_loss"].as_f64())
        .collect();
    assert!(losses.len() >= 6, "{losses:?}");
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (early, late) = (mean(&losses[..3]), mean(&losses[losses.len() - 3..]));
    let summary = guard("the run to end", server.wait()).await.expect("ran");
    let s = status.borrow().clone();
    let test_loss = summary.test_loss.expect("evaluated at the end");
    println!(
        "two tabs, {model_flags:?}: training loss {early:.4} over the first three updates, \
         {late:.4} over the last three; test loss {test_loss:.4} at round {}",
        summary.rounds
    );
    assert!(late < early, "the training loss did not fall: {losses:?}");
    assert!(test_loss < early, "{test_loss} against {early}");
    only_tabs_all_contributing(&s);
    assert_never_flagged("tabs", &s, summary.rounds, 2, rounds);
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
    first.close().await;
    second.close().await;
    s
}

/// The `cnn` in two tabs, every answer recomputed: the short form of the run to 98 %
/// (`bench/long-runs.sh cnn-tabs-98`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tabs_train_the_cnn_and_its_loss_falls() {
    let _heavy = heavy().await;
    two_tabs_loss_falls(&["--model", "cnn"], 30).await;
}

/// The 0.8M GPT in two tabs, every answer replayed: the short form of the run to a
/// validation loss of 2.0 (`bench/long-runs.sh gpt-tabs-2.0`), at batches of 4 windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tabs_train_the_08m_gpt_and_its_loss_falls() {
    let _heavy = heavy().await;
    let s = two_tabs_loss_falls(
        &["--model", "gpt", "--batch-size", "4", "--warmup", "4"],
        16,
    )
    .await;
    assert!(s.param_count > 800_000, "{}", s.param_count);
}

/// The coordinator stops (its checkpoint taken on stopping) and a new one resumes on the same
/// address: nobody touches the tabs, they come back by themselves, keep their worker ids,
/// and training continues from the round it stopped at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tabs_reconnect_by_themselves_after_a_coordinator_restart() {
    let _heavy = heavy().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = ["--checkpoint-dir", dir.path().to_str().expect("utf-8")];
    let server = start_server(&flags).await;
    let addr = server.addr;
    let mut status = server.status.clone();
    let tabs = [Browser::open(&page(addr)), Browser::open(&page(addr))];
    let s = wait_status(&mut status, "two training tabs", |s| {
        browsers(s) == 2 && s.round >= 10
    })
    .await;
    let ids: Vec<u32> = s.worker_list.iter().map(|w| w.id).collect();

    let summary = guard("a clean stop", server.stop()).await.expect("stops");
    assert_eq!(summary.checkpoint_error, None);

    // A new coordinator on the same address; nobody touches the tabs.
    let resume = [flags[0], flags[1], "--resume"];
    let restarted = start_server_at(addr, &resume).await;
    let mut status = restarted.status.clone();
    assert_eq!(
        status.borrow().round,
        summary.rounds,
        "resumed where it stopped"
    );
    let s = wait_status(&mut status, "the tabs to rejoin and train", |s| {
        browsers(s) == 2 && s.counters.resumed >= 2 && s.round >= summary.rounds + 10
    })
    .await;
    assert_eq!(s.workers, 2);
    let ids_after: Vec<u32> = s.worker_list.iter().map(|w| w.id).collect();
    assert_eq!(ids_after, ids, "the tabs kept their worker ids");
    for tab in tabs {
        tab.close().await;
    }
    stop(restarted).await;
}

/// `kill -9` of the real coordinator with two tabs training, then `--resume` on the same
/// port from a checkpoint older than the tabs' last batches: the tabs come back by
/// themselves as themselves, and the coordinator, recomputing every answer, strikes neither.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tabs_are_not_struck_after_a_kill_9_and_a_resume() {
    let _heavy = heavy().await;
    let mut run = crate::durability::kill_9_and_resume(|addr| {
        [Browser::open(&page(addr)), Browser::open(&page(addr))]
    })
    .await;
    let s = run.assert_nobody_struck().await;
    let ids = |s: &serde_json::Value| -> Vec<u64> {
        let list = s["worker_list"].as_array().expect("list");
        list.iter().map(|w| w["id"].as_u64().expect("id")).collect()
    };
    assert_eq!(ids(&s), ids(&run.before), "the tabs kept their worker ids");
    assert!(s["resumed"].as_u64().expect("count") >= 2, "{s}");
    for tab in run.terminate().await {
        tab.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_a_tab_keeps_its_worker_id() {
    let _heavy = heavy().await;
    let server = start_server(&[]).await;
    let mut status = server.status.clone();
    let tab = Browser::open_with_devtools(&page(server.addr));
    let s = wait_status(&mut status, "the tab to train", |s| {
        browsers(s) == 1 && s.worker_list[0].gradients > 0
    })
    .await;
    let id = s.worker_list[0].id;

    tab.reload().await;
    // The reloaded page presents the token from sessionStorage and gets its id back.
    let s = wait_status(&mut status, "the reloaded tab to resume", |s| {
        s.counters.resumed == 1 && browsers(s) == 1
    })
    .await;
    assert_eq!(
        s.worker_list[0].id, id,
        "same worker id after reload: {:?}",
        s.worker_list
    );
    let gradients = s.worker_list[0].gradients;
    wait_status(&mut status, "it to keep training", |s| {
        s.worker_list
            .first()
            .is_some_and(|w| w.id == id && w.gradients > gradients)
    })
    .await;
    tab.close().await;
    stop(server).await;
}

/// A run with a join token: a tab opened with the invitation link trains; one opened without
/// it is refused, says why, and stops retrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invitation_link_lets_a_tab_in_and_a_tab_without_it_is_told_why() {
    let server = start_server(&["--join-token", "s3cret"]).await;
    let mut status = server.status.clone();
    let invited = Browser::open(&format!("http://{}/#token=s3cret", server.addr));
    wait_status(&mut status, "the invited tab to train", |s| {
        browsers(s) == 1 && s.round >= 3
    })
    .await;
    let stranger = Browser::open_with_devtools(&page(server.addr));
    // Its Hello without the token is refused (an event the coordinator counts); by then the
    // page is up and its DevTools endpoint listening.
    wait_status(&mut status, "the uninvited tab's refusal", |s| {
        s.counters.sessions_rejected >= 1
    })
    .await;
    let message = "document.getElementById('message').textContent";
    let state = "document.getElementById('state').dataset.state";
    let mut polls = 0;
    loop {
        let shown = stranger.evaluate(message).await;
        if shown
            .as_str()
            .is_some_and(|m| m.contains("invitation link"))
        {
            break;
        }
        polls += 1;
        assert!(polls < 2000, "the page never said why: {shown}");
        tokio::task::yield_now().await;
    }
    assert_eq!(
        stranger.evaluate(state).await,
        "error",
        "it stopped, not retrying"
    );
    let s = status.borrow().clone();
    assert_eq!(browsers(&s), 1, "only the invited tab is a worker");
    assert!(s.counters.sessions_rejected >= 1, "{s:?}");
    invited.close().await;
    stranger.close().await;
    stop(server).await;
}

/// What the page's message line says once it contains `needle`.
async fn until_message(tab: &Browser, needle: &str) -> String {
    let expression = format!("document.getElementById('message').textContent.includes({needle:?})");
    tab.until(&format!("the page to say {needle:?}"), &expression)
        .await;
    let shown = tab
        .evaluate("document.getElementById('message').textContent")
        .await;
    shown.as_str().expect("text").to_string()
}

/// A coordinator whose page has no wasm package (here `--web-dir` without `pkg/`; the same
/// sentence comes from a binary built before the package): the page says the training code
/// is missing and how to build it, not "[object Event]".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_without_its_wasm_package_says_why_it_cannot_train() {
    let web = tempfile::tempdir().expect("temp dir");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../web");
    for file in ["index.html", "main.js", "worker.js", "wasm.js", "style.css"] {
        std::fs::copy(source.join(file), web.path().join(file)).expect("copy the page");
    }
    let server = start_server(&["--web-dir", web.path().to_str().expect("utf-8")]).await;
    let tab = Browser::open_with_devtools(&page(server.addr));
    let shown = until_message(&tab, "not on this coordinator").await;
    assert!(shown.contains("pkg/worker_wasm.js: HTTP 503"), "{shown}");
    assert!(
        shown.contains("wasm-pack build"),
        "how to build it: {shown}"
    );
    let state = tab
        .evaluate("document.getElementById('state').dataset.state")
        .await;
    assert_eq!(state, "error");
    tab.close().await;
    stop(server).await;
}

/// A socket the coordinator refuses at the upgrade (here: this address already holds
/// `--max-per-ip` connections): the page asks the coordinator and shows its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_socket_is_explained_on_the_page() {
    let server = start_server(&["--max-per-ip", "1"]).await;
    // A client from the same address holds the one connection allowed.
    let mut holder = RawClient::connect(server.addr).await;
    holder.hello().await;
    let tab = Browser::open_with_devtools(&page(server.addr));
    let shown = until_message(&tab, "the coordinator refused the connection").await;
    assert!(
        shown.contains("127.0.0.1 already has 1 connections open (--max-per-ip 1)"),
        "{shown}"
    );
    assert!(shown.contains("retrying in"), "{shown}");
    // The holder leaves: the tab gets in by itself.
    drop(holder);
    let mut status = server.status.clone();
    wait_status(&mut status, "the tab to train", |s| {
        browsers(s) == 1 && s.round >= 2
    })
    .await;
    tab.close().await;
    stop(server).await;
}

/// At `--verify-fraction 1`, the coordinator recomputes every gradient of two tabs for 200
/// rounds: one in the page's compression (int2, confirmed as int4 for single gradients) in
/// the build with relaxed SIMD, whose multiply-adds fuse on this
/// CPU (it says so in its `Hello`, and is replayed fused), and one on exact f32 in the
/// plain build (`?relaxed=0`, unfused): wasm's gradients always match native ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_tabs_are_never_flagged_at_verify_fraction_1() {
    let _heavy = heavy().await;
    let server = start_server(&[
        "--min-workers",
        "2",
        "--verify-fraction",
        "1",
        "--max-rounds",
        "200",
    ])
    .await;
    let mut status = server.status.clone();
    let _fused = Browser::open(&page(server.addr));
    let _exact = Browser::open(&format!(
        "http://{}/?compression=none&relaxed=0",
        server.addr
    ));
    let s = wait_status(&mut status, "both tabs", |s| browsers(s) == 2).await;
    let mut fused: Vec<(&str, bool)> = s
        .worker_list
        .iter()
        .map(|w| (w.compression, w.fused))
        .collect();
    fused.sort();
    // Chromium here has relaxed SIMD, and this CPU FMA (docs/TOOLCHAIN.md).
    assert_eq!(fused, [("int4", true), ("none", false)], "{s:?}");
    let summary = guard("200 verified rounds", server.wait())
        .await
        .expect("ran");
    let s = status.borrow().clone();
    assert_never_flagged("tabs", &s, summary.rounds, 2, 200);
    assert_eq!(browsers(&s), 2);
}

/// The volunteer page: its CPU setting lowers the tab's samples/s (by the page's own figure)
/// and is remembered across a reload; it shows this tab's share of the work and the swarm's
/// accuracy curve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_setting_lowers_the_tabs_rate_and_is_remembered() {
    let _heavy = heavy().await;
    let server = start_server(&["--eval-interval", "5"]).await;
    let tab = Browser::open_with_devtools(&page(server.addr));
    let rate = "Number(document.getElementById('rate').textContent.replace(/,/g, ''))";
    let gradients = "Number(document.getElementById('gradients').textContent)";
    tab.until(
        "30 gradients at 100 %",
        &format!("{gradients} >= 30 && {rate} > 0"),
    )
    .await;
    let full = tab.evaluate(rate).await.as_f64().expect("a rate");
    tab.evaluate(
        "const c = document.getElementById('cpu'); c.value = '25'; \
         c.dispatchEvent(new Event('change')); true",
    )
    .await;
    tab.until(
        "the rate to fall under half",
        &format!("{rate} > 0 && {rate} < {}", full * 0.5),
    )
    .await;
    let quarter = tab.evaluate(rate).await.as_f64().expect("a rate");
    println!("samples/s: {full:.0} at 100 %, {quarter:.0} at 25 %");
    tab.until(
        "this tab's share",
        "document.getElementById('share').textContent === '100.0 % of the gradients'",
    )
    .await;
    tab.until(
        "the accuracy curve",
        "Number(document.getElementById('curve').dataset.points) >= 2",
    )
    .await;
    tab.reload().await;
    tab.until(
        "the setting after a reload",
        "document.getElementById('cpu')?.value === '25' && \
         localStorage.getItem('crowdtrain.cpu') === '25'",
    )
    .await;
    tab.close().await;
    stop(server).await;
}

/// A tab on two cores (its training Web Worker and one helper, `?cores=2&pin=1`) is one
/// worker to the coordinator, which sees its answers computed in two parts and recomputes
/// every one, local phases with dropout included, bit for bit: never flagged. The page says
/// what it computes on; the CPU share, pause and closing the tab act as with one core.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tab_on_two_cores_is_one_worker_and_replayed_exactly() {
    let _heavy = heavy().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = dir.path().join("dropout.json");
    let json = r#"{"layers": [{"type": "dense", "units": 64}, {"type": "relu"},
        {"type": "dropout", "p": 0.25}, {"type": "dense"}]}"#;
    std::fs::write(&spec, json).expect("write the spec");
    let server = start_server(&[
        "--model",
        spec.to_str().expect("utf-8"),
        "--verify-fraction",
        "1",
        "--local-steps",
        "4",
    ])
    .await;
    let mut status = server.status.clone();
    let tab = Browser::open_with_devtools(&format!(
        "http://{}/?cores=2&pin=1&compression=none",
        server.addr
    ));
    tab.until(
        "the page to compute on 2 cores",
        "document.getElementById('device').dataset.cores === '2'",
    )
    .await;
    let s = wait_status(&mut status, "answers from the tab's two cores", |s| {
        s.worker_list
            .iter()
            .any(|w| w.cores == 2 && w.gradients >= 3)
    })
    .await;
    assert_eq!((s.workers, browsers(&s)), (1, 1), "one worker, not two");
    tab.until(
        "the helper to compute parts",
        "Number(document.getElementById('device').dataset.helped) >= 8",
    )
    .await;
    let missed = tab
        .evaluate("Number(document.getElementById('device').dataset.missed)")
        .await;
    assert_eq!(
        missed.as_f64(),
        Some(0.0),
        "no part recomputed after a helper failed"
    );

    // The CPU share, with the helper computing too: set to 25 %, the tab computes at most
    // a quarter of its time connected (its own figure; idling is proportional to the time
    // computing, so a loaded machine does not move it, where it would a rate).
    let gradients = "Number(document.getElementById('gradients').textContent)";
    tab.evaluate(
        "const c = document.getElementById('cpu'); c.value = '25'; \
         c.dispatchEvent(new Event('change')); true",
    )
    .await;
    // Pause and resume (it leaves at once), so that the share counts from 25 % on.
    tab.evaluate("document.getElementById('toggle').click(); true")
        .await;
    tab.until(
        "paused",
        "document.getElementById('state').dataset.state === 'paused'",
    )
    .await;
    wait_status(&mut status, "the paused tab to leave", |s| s.workers == 0).await;
    let before = tab.evaluate(gradients).await.as_f64().expect("a count");
    tab.evaluate("document.getElementById('toggle').click(); true")
        .await;
    tab.until(
        "20 answers at 25 %",
        &format!("{gradients} >= {}", before + 20.0),
    )
    .await;
    let share = tab
        .evaluate("parseFloat(document.getElementById('computing').textContent)")
        .await
        .as_f64()
        .expect("a share");
    assert!(share <= 30.0, "computing {share} % of the time at 25 %");
    wait_status(&mut status, "the tab back", |s| s.workers == 1).await;
    tab.close().await;
    wait_status(&mut status, "the closed tab to leave", |s| s.workers == 0).await;
    let s = status.borrow().clone();
    println!(
        "a tab on 2 cores: computing {share} % of the time at 25 %; {} answers verified, {} \
         mismatches",
        s.counters.gradients_verified, s.counters.verification_mismatches
    );
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    assert!(s.counters.gradients_verified >= 10, "{s:?}");
    assert!(s.bans.is_empty(), "{s:?}");
    stop(server).await;
}

/// Two tabs on the GPU path (`?gpu=fallback`: Chromium's SwiftShader adapter here, which a
/// page uses only when asked) train the `mlp` to 90 % with every answer recomputed
/// (`--verify-fraction 1`): answers said to be unordered (`cores` 0 in the status), each
/// within rounding of the coordinator's, never flagged. The page names the adapter; set to
/// "do not use it", the tab goes back to its CPU and its answers are replayed exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tabs_train_on_the_gpu_path_and_are_never_flagged() {
    let _heavy = heavy().await;
    let server = start_server(&["--eval-interval", "10", "--verify-fraction", "1"]).await;
    let mut status = server.status.clone();
    let url = format!("http://{}/?gpu=fallback", server.addr);
    let (first, second) = (
        Browser::open(&url),
        Browser::open_with_devtools(&format!("{url}&compression=none")),
    );
    second
        .until(
            "the page to compute on the GPU",
            "document.getElementById('device').dataset.device === 'gpu'",
        )
        .await;
    let device = second
        .evaluate("document.getElementById('device').textContent")
        .await;
    let device = device.as_str().unwrap_or_default().to_owned();
    assert!(
        device.starts_with("GPU: ") && device.contains("fallback"),
        "{device}"
    );
    wait_status(&mut status, "both tabs to answer from their GPUs", |s| {
        browsers(s) == 2
            && s.worker_list
                .iter()
                .all(|w| w.cores == 0 && w.gradients > 0)
    })
    .await;
    // The operator's dashboard says so in its workers' table.
    let dashboard = Browser::open_with_devtools(&format!("http://{}/dashboard", server.addr));
    dashboard
        .until(
            "the dashboard to show both tabs on a GPU",
            "(() => { const rows = [...document.querySelectorAll('#workers tbody tr')]; \
             return rows.length === 2 && rows.every((r) => r.cells[6].textContent === 'GPU'); })()",
        )
        .await;
    dashboard.close().await;
    let started = Instant::now();
    let s = wait_status(&mut status, "90 % test accuracy from the GPU tabs", |s| {
        s.test_accuracy.is_some_and(|a| a >= 0.90)
    })
    .await;
    println!(
        "two GPU tabs ({device}): {:.1} % test accuracy at round {}, {:.1} s; {} answers \
         verified, {} mismatches",
        s.test_accuracy.unwrap_or_default() * 100.0,
        s.round,
        started.elapsed().as_secs_f64(),
        s.counters.gradients_verified,
        s.counters.verification_mismatches
    );
    only_tabs_all_contributing(&s);
    assert!(s.counters.gradients_verified >= 20, "{s:?}");
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    assert!(s.bans.is_empty(), "{s:?}");

    // Back to the CPU: the page says so, and the tab's answers are ordered again.
    second
        .evaluate(
            "const g = document.getElementById('gpu'); g.value = 'off'; \
             g.dispatchEvent(new Event('change')); true",
        )
        .await;
    second
        .until(
            "the page to compute on the CPU",
            "document.getElementById('device').dataset.device === 'cpu'",
        )
        .await;
    wait_status(&mut status, "an answer from the tab's CPU", |s| {
        s.worker_list.iter().any(|w| w.cores == 1)
    })
    .await;
    let s = status.borrow().clone();
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    first.close().await;
    second.close().await;
    stop(server).await;
}

/// A run that ends (here `--max-rounds`) tells its tabs: the page says the training is
/// finished and thanks the volunteer, and the tab stops computing instead of retrying a
/// coordinator that has gone (issue 34). The coordinator, as an operator runs it, goes on
/// serving the finished run: a page opened then says so too, and trains nothing, and the
/// dashboard says where the model is and how to export it (issue 46).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_thanks_its_tab_which_stops_computing() {
    let kept = tempfile::tempdir().expect("temp dir");
    let dir = kept.path().to_str().expect("utf-8");
    let server = start_kept_server(&["--max-rounds", "30", "--checkpoint-dir", dir]).await;
    let mut status = server.status.clone();
    let tab = Browser::open_with_devtools(&page(server.addr));
    let done = wait_status(&mut status, "30 rounds, and the end", |s| {
        s.state == server::status::State::Done
    })
    .await;
    assert_eq!(done.round, 30);
    for (tab, when) in [
        (tab, "training"),
        (Browser::open_with_devtools(&page(server.addr)), "after"),
    ] {
        let shown = until_message(&tab, "Thank you for lending this tab").await;
        assert!(shown.contains("training finished"), "{when}: {shown}");
        let state = tab
            .evaluate("document.getElementById('state').dataset.state")
            .await;
        assert_eq!(state, "finished", "{when}, not retrying: {shown}");
        let paused = tab
            .evaluate("document.getElementById('toggle').disabled")
            .await;
        assert_eq!(paused, true, "{when}: nothing left to pause or resume");
        tab.close().await;
    }
    let s = status.borrow().clone();
    assert_eq!(
        (s.round, s.workers),
        (30, 0),
        "nobody trains a finished run: {s:?}"
    );
    let dashboard = Browser::open_with_devtools(&format!("http://{}/dashboard", server.addr));
    dashboard
        .until(
            "the dashboard to say the run is finished",
            "document.getElementById('kept').dataset.state === 'done'",
        )
        .await;
    let said = dashboard
        .evaluate("document.getElementById('kept').textContent")
        .await;
    let said = said.as_str().expect("text");
    assert!(
        said.starts_with("Training finished")
            && said.contains(&format!("coordinator export --checkpoint-dir {dir} --out")),
        "{said}"
    );
    dashboard.close().await;
    stop(server).await;
}

/// A tab on the GPU path (`?gpu=fallback`: SwiftShader here) trains a small GPT step by
/// step, every answer recomputed (`--verify-fraction 1`): each said to be unordered
/// (`cores` 0), checked tensor by tensor against the coordinator's gradient and never
/// flagged, while the validation loss falls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tab_trains_a_gpt_on_its_gpu_and_is_never_flagged() {
    let _heavy = heavy().await;
    // A mismatch's reason, should one come, in the test's output.
    let _ = tracing_subscriber::fmt().with_env_filter("warn").try_init();
    let mut flags = crate::language::SMALL_GPT.to_vec();
    flags.extend(["--verify-fraction", "1", "--eval-interval", "10"]);
    let server = start_server(&flags).await;
    let mut status = server.status.clone();
    let tab = Browser::open_with_devtools(&format!("http://{}/?gpu=fallback", server.addr));
    tab.until(
        "the page to compute on the GPU",
        "document.getElementById('device').dataset.device === 'gpu'",
    )
    .await;
    let first = wait_status(&mut status, "a first evaluation", |s| s.test_loss.is_some()).await;
    let s = wait_status(
        &mut status,
        "40 answers from the tab's GPU, evaluated",
        |s| {
            s.evaluated_round >= first.evaluated_round.map(|r| r + 30)
                && s.worker_list
                    .iter()
                    .any(|w| w.cores == 0 && w.gradients >= 40)
        },
    )
    .await;
    let (before, after) = (
        first.test_loss.expect("evaluated"),
        s.test_loss.expect("evaluated"),
    );
    println!(
        "a GPT on a tab's GPU: validation loss {before:.3} at round {:?}, {after:.3} at round \
         {:?}; {} answers verified, {} mismatches",
        first.evaluated_round,
        s.evaluated_round,
        s.counters.gradients_verified,
        s.counters.verification_mismatches
    );
    assert!(after < before - 0.1, "the loss falls: {before} to {after}");
    assert!(s.counters.gradients_verified >= 40, "{s:?}");
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
    assert!(s.bans.is_empty(), "{s:?}");
    tab.close().await;
    stop(server).await;
}

/// A tab trains a GPT beside a native worker, every answer replayed natively (the wasm GPT
/// computes bit for bit what the native one does), and its page shows a language model: the
/// validation loss with perplexity and bits per character, the tab's tokens per second and
/// a core's share of them, what the model writes, and the loss curve from the run's first
/// evaluation though it opened late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tab_trains_a_gpt_and_its_page_shows_a_language_model() {
    let _heavy = heavy().await;
    let mut flags = crate::language::SMALL_GPT.to_vec();
    flags.extend([
        "--verify-fraction",
        "1",
        "--eval-interval",
        "5",
        "--warmup",
        "5",
    ]);
    let server = start_server(&flags).await;
    let mut status = server.status.clone();
    let (native, _cancel) = spawn_worker(server.addr);
    wait_status(&mut status, "a native worker's rounds, evaluated", |s| {
        s.round >= 20 && s.evaluated_round >= Some(10)
    })
    .await;
    let tab = Browser::open_with_devtools(&page(server.addr));
    tab.until(
        "the page to show a sample and the tab's tokens per second",
        "document.getElementById('sample-text').textContent.length > 20 && \
         document.getElementById('rate').textContent !== '–' && \
         document.getElementById('accuracy').textContent.includes('bits per character')",
    )
    .await;
    let text = |id: &str| format!("document.getElementById('{id}').textContent");
    assert_eq!(
        tab.evaluate(&text("accuracy-label")).await,
        "Validation loss"
    );
    assert_eq!(tab.evaluate(&text("rate-label")).await, "Tokens / s");
    assert_eq!(
        tab.evaluate(&text("rate-core-label")).await,
        "Tokens / s a core"
    );
    // The rate a core: the tab's rate over the cores it computed on, each rounded apart.
    let shown = tab
        .evaluate(
            "[document.getElementById('rate').textContent, \
              document.getElementById('rate-core').textContent, \
              document.getElementById('device').dataset.used ?? \
              document.getElementById('device').dataset.cores] \
             .map(t => Number(String(t).replace(/,/g, '')))",
        )
        .await;
    let [rate, per_core, cores] = [0, 1, 2].map(|i| shown[i].as_f64().expect("a number"));
    println!("the tab: {rate} tokens/s, {per_core} a core on {cores}");
    assert!(
        rate > 0.0 && cores >= 1.0 && (per_core * cores - rate).abs() <= cores,
        "{shown}"
    );
    let shown = tab.evaluate(&text("accuracy")).await;
    assert!(
        shown.as_str().expect("text").contains("perplexity"),
        "{shown}"
    );
    let first = tab
        .evaluate("Number(document.getElementById('curve').dataset.first)")
        .await;
    assert_eq!(
        first.as_u64(),
        Some(5),
        "the curve from the first evaluation"
    );
    let s = wait_status(&mut status, "the tab's answers, replayed", |s| {
        browsers(s) == 1
            && s.worker_list
                .iter()
                .any(|w| w.kind == "browser" && w.gradients >= 10)
    })
    .await;
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
    tab.close().await;
    stop(server).await;
    let _ = guard("the native worker", native).await;
}

/// The language model's tab target: two tabs alone train nanoGPT's CPU shape (0.8M
/// parameters) on the embedded Shakespeare to a validation loss of 2.0, with its defaults
/// (AdamW, warm-up, clipping), and the page shows what the model writes. Prints the wall
/// time (docs/BENCHMARKS.md).
#[ignore = "a benchmark, not a test: bench/long-runs.sh gpt-tabs-2.0"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tabs_train_a_gpt_to_a_validation_loss_of_2() {
    let _heavy = heavy().await;
    let server = start_server(&[
        "--model",
        "gpt",
        "--batch-size",
        "12",
        "--min-workers",
        "2",
        "--eval-interval",
        "50",
        "--target-loss",
        "2.0",
    ])
    .await;
    let mut status = server.status.clone();
    let first = Browser::open_with_devtools(&page(server.addr));
    let _second = Browser::open(&page(server.addr));
    wait_status(&mut status, "both tabs to join", |s| browsers(s) == 2).await;
    let started = Instant::now();
    let s = wait_status(&mut status, "a sample on the status", |s| {
        s.sample.is_some()
    })
    .await;
    assert!(s.sample.is_some_and(|w| !w.text.is_empty()));
    first
        .until(
            "the page to show what the model writes",
            "document.getElementById('sample-text').textContent.length > 0",
        )
        .await;
    // Minutes, not the usual guard's two: a bound against a hang all the same.
    let summary = tokio::time::timeout(std::time::Duration::from_secs(1200), server.wait())
        .await
        .expect("a validation loss of 2.0 within 20 minutes")
        .expect("ran");
    let s = status.borrow().clone();
    let loss = summary.test_loss.expect("evaluated");
    println!(
        "two tabs, gpt: validation loss {loss:.4} at round {} in {:.0} s; it wrote {:?}",
        summary.rounds,
        started.elapsed().as_secs_f64(),
        s.sample.as_ref().map(|w| &w.text)
    );
    assert!(summary.reached_target && loss <= 2.0, "{summary:?}");
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
}

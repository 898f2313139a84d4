//! The operator's dashboard in real headless Chromium during a training run: its charts fill
//! from the pushed status, its table lists the connected workers, and it steers the run with
//! the admin token. A screenshot is saved as a test artifact.

use std::path::PathBuf;

use crate::browser::Browser;
use crate::util::*;

const TOKEN: &str = "dashboard-test-token-42";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_run_live_and_steers_it() {
    let _heavy = heavy().await;
    // `--patience 0`: the run goes on until the test pauses it (on a plateau it would
    // finish within seconds, and the dashboard's lines would stop moving).
    let server = start_server(&[
        "--admin-token",
        TOKEN,
        "--eval-interval",
        "5",
        "--patience",
        "0",
    ])
    .await;
    let addr = server.addr;
    let mut status = server.status.clone();
    let workers: Vec<_> = (0..2).map(|_| spawn_worker(addr)).collect();
    wait_status(&mut status, "two workers training", |s| {
        s.workers == 2 && s.round >= 30
    })
    .await;

    let tab = Browser::open_with_devtools(&format!("http://{addr}/dashboard"));
    tab.until(
        "the charts to hold points",
        "['loss','accuracy','workers','duration','gradients','bytes'].every(\
           n => Number(document.getElementById('chart-' + n)?.dataset.points) >= 2)",
    )
    .await;
    // Opened at round 30 or later, it still draws the run from its start (the history).
    let first = tab
        .evaluate("Number(document.getElementById('chart-loss').dataset.first)")
        .await;
    assert_eq!(first.as_u64(), Some(1), "the loss chart starts at round 1");
    let s = status.borrow().clone();
    let ids: Vec<u32> = s.worker_list.iter().map(|w| w.id).collect();
    tab.until(
        "the table to list both workers",
        &format!(
            "JSON.stringify([...document.querySelectorAll('#workers tbody tr')]\
               .map(r => Number(r.dataset.worker))) === '{}'",
            serde_json::to_string(&ids).expect("json")
        ),
    )
    .await;
    let run = tab
        .evaluate("document.getElementById('run').textContent")
        .await;
    let run = run.as_str().expect("text");
    assert!(
        run.contains("model mlp: input 1x28x28; dense 128; relu; dense 10 (101,770 parameters)")
            && run.contains("embedded MNIST")
            && run.contains("sync"),
        "{run}"
    );
    // Two workers of batch 32: the crowd's batch is 64, and the line under the title sets
    // the gradient noise scale the coordinator read from their answers against it.
    let noise = status
        .borrow()
        .noise_scale
        .expect("sync rounds of two answers");
    assert_eq!(noise.crowd_batch, 64.0);
    assert!(noise.readings >= 5, "{noise:?}");
    tab.until(
        "the efficiency line to say whether more volunteers help",
        "/(gradient noise scale ≈ \\d+ samples|noise drowns the gradient) .*crowd batch of 64/\
           .test(document.getElementById('efficiency').textContent)",
    )
    .await;
    // Past five seconds of statuses it says how busy the checks' cores are (the server's
    // default here: half of this machine's cores).
    let cores = status.borrow().verify_cores;
    assert!(cores >= 1);
    tab.until(
        "the efficiency line to give the checks' load",
        &format!(
            "/checks [\\d.]+ % of {cores} cores?/\
               .test(document.getElementById('efficiency').textContent)"
        ),
    )
    .await;
    let polylines = tab
        .evaluate("document.querySelectorAll('svg polyline').length")
        .await;
    assert!(polylines.as_u64() >= Some(6), "{polylines}");

    // Series that are equal both show: connected and in the round are both 2 here; the
    // later one is dashed over the earlier, and the caption gives each one's value.
    let dashed = tab
        .evaluate(
            "['s1','s2'].map(c => getComputedStyle(document.querySelector('#chart-workers .' + c))\
               .strokeDasharray)",
        )
        .await;
    let dashed = dashed.as_array().expect("two styles");
    assert!(dashed.iter().all(|d| d != "none"), "{dashed:?}");
    tab.until(
        "the workers' legend to give their values",
        "[...document.getElementById('chart-workers').closest('figure')\
           .querySelectorAll('figcaption .v')].map(v => v.textContent.trim()).join() === '2,2,0'",
    )
    .await;
    // The accuracy axis is zoomed to the data, not 0 to its maximum.
    let axis = tab
        .evaluate(
            "(() => { const svg = document.getElementById('chart-accuracy'); \
               const ys = [...svg.querySelectorAll('polyline')].length; \
               return [Number(svg.dataset.yMin), ys]; })()",
        )
        .await;
    let s = status.borrow().clone();
    let y_min = axis[0].as_f64().expect("the axis' minimum");
    assert!(y_min > 0.0, "the accuracy axis starts at {y_min}: {axis}");
    assert!(
        y_min <= s.test_accuracy.expect("evaluated") * 100.0,
        "{y_min} below the data"
    );

    // Some history for the screenshot.
    tab.until(
        "a few dozen rounds drawn",
        "Number(document.getElementById('chart-loss').dataset.points) >= 20",
    )
    .await;

    // Read-only without the token: no controls; with it, Pause pauses the run.
    let shown = "document.querySelector('[data-action=pause]').checkVisibility()";
    assert_eq!(tab.evaluate(shown).await, serde_json::Value::Bool(false));
    tab.evaluate(&format!(
        "document.getElementById('token').value = '{TOKEN}'; \
         document.getElementById('token-form').requestSubmit(); true"
    ))
    .await;
    tab.until("the controls to show", shown).await;
    tab.evaluate("document.querySelector('[data-action=pause]').click(); true")
        .await;
    wait_status(&mut status, "paused from the dashboard", |s| {
        s.state == server::status::State::Paused
    })
    .await;
    tab.until(
        "the pause to be confirmed",
        "document.getElementById('admin-result').textContent.startsWith('paused')",
    )
    .await;
    tab.until(
        "the badge to say so",
        "document.getElementById('state').dataset.state === 'paused'",
    )
    .await;

    let png = tab.screenshot().await;
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&dir).expect("artifact dir");
    let path = dir.join("dashboard.png");
    std::fs::write(&path, &png).expect("write screenshot");
    println!(
        "dashboard screenshot: {} ({} bytes)",
        path.display(),
        png.len()
    );

    tab.close().await;
    for (_, cancel) in workers {
        cancel.cancel();
    }
    stop(server).await;
}

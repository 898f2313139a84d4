//! The admin API against the real binary: 401 without the token; pause, resume, learning
//! rate, checkpoint now, replace the weights, kick, ban, stop; every action in the log.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::util::*;

const TOKEN: &str = "a-test-admin-token-0123";
const AUTH: (&str, &str) = ("Authorization", "Bearer a-test-admin-token-0123");

async fn post(addr: SocketAddr, action: &str, auth: bool, body: &str) -> (u16, Value) {
    let headers: &[(&str, &str)] = if auth { &[AUTH] } else { &[] };
    let line = format!("POST /api/admin/{action} HTTP/1.1");
    let (code, _, body) = http_request(addr, &line, headers, body.as_bytes()).await;
    (code, serde_json::from_slice(&body).expect("JSON answer"))
}

async fn put_params(addr: SocketAddr, auth: bool, file: &[u8]) -> (u16, Value) {
    let headers: &[(&str, &str)] = if auth { &[AUTH] } else { &[] };
    let (code, _, body) = http_request(addr, "PUT /api/params HTTP/1.1", headers, file).await;
    (code, serde_json::from_slice(&body).expect("JSON answer"))
}

/// The binary's JSON log lines, all kept, read up to a line matching a predicate.
struct Log {
    rx: UnboundedReceiver<String>,
    seen: Vec<Value>,
}

impl Log {
    async fn until(&mut self, what: &str, mut pred: impl FnMut(&Value) -> bool) -> Value {
        guard(what, async {
            loop {
                let line = self.rx.recv().await.expect("coordinator running");
                let v: Value = serde_json::from_str(&line).expect("a JSON log line");
                self.seen.push(v.clone());
                if pred(&v) {
                    return v;
                }
            }
        })
        .await
    }

    async fn round(&mut self, at_least: u64) -> Value {
        self.until(&format!("round {at_least}"), |v| {
            v["fields"]["message"] == "round" && v["fields"]["round"].as_u64() >= Some(at_least)
        })
        .await
    }
}

fn worker(addr: SocketAddr) -> tokio::task::JoinHandle<Result<worker::Ended, worker::RunError>> {
    let options = worker::Options {
        url: ws_url(addr),
        ..worker::Options::default()
    };
    tokio::spawn(async move {
        worker::run(&options, CancellationToken::new())
            .await
            .map(|(ended, _)| ended)
    })
}

fn removed_with(result: Result<worker::Ended, worker::RunError>, code: protocol::ErrorCode) {
    match result {
        Err(worker::RunError::Worker(worker_core::WorkerError::Rejected { code: got, .. })) => {
            assert_eq!(got, code);
        }
        other => panic!("expected {code:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_steers_a_run_through_the_admin_api() {
    let _heavy = heavy().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = [
        "--admin-token",
        TOKEN,
        "--log-format",
        "json",
        "--checkpoint-dir",
        dir.path().to_str().expect("utf-8"),
    ];
    let bin = env!("CARGO_BIN_EXE_coordinator");
    // As an operator runs it (no --exit-when-finished): the stop at the end still exits.
    let (mut child, addr, rx) = spawn_kept_coordinator(bin.as_ref(), dir.path(), &flags).await;
    let mut log = Log {
        rx,
        seen: Vec::new(),
    };

    // Without the token, or with a wrong one: 401, and nothing happens.
    let (code, v) = post(addr, "pause", false, "").await;
    assert_eq!(code, 401, "{v}");
    assert!(
        v["error"].as_str().expect("why").contains("admin token"),
        "{v}"
    );
    let wrong = [("Authorization", "Bearer not-the-token-at-all")];
    let (code, _, _) = http_request(addr, "POST /api/admin/stop HTTP/1.1", &wrong, b"").await;
    assert_eq!(code, 401);
    assert_eq!(put_params(addr, false, b"anything").await.0, 401);

    let a = worker(addr);
    log.round(3).await;

    // Pause: no new round opens (the one open may complete) until resumed.
    let (code, v) = post(addr, "pause", true, "").await;
    assert_eq!(code, 200, "{v}");
    let paused = log
        .until("the pause", |v| v["fields"]["action"] == "pause")
        .await;
    let status = get_status_json(addr).await;
    assert_eq!(status["state"], "paused", "{status}");
    // A broken pause would run dozens of rounds in this window.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let still = get_status_json(addr).await;
    assert!(
        still["round"].as_u64() <= status["round"].as_u64().map(|r| r + 1),
        "paused at {}, now {}",
        status["round"],
        still["round"]
    );

    // Replace the weights while paused: checked first, then exactly what was sent.
    let mlp = model::Network::mlp(&[784, 128, 10]).expect("valid");
    let other = model::Network::mlp(&[784, 64, 10]).expect("valid");
    let wrong_shape = server::tensors_file::encode_params(
        other.layout(),
        &server::tensors_file::le_bytes(&vec![0.0; other.param_count()]),
        ("round", "0".into()),
    );
    let (_, _, before) = http_get(addr, "/api/params").await;
    let (code, v) = put_params(addr, true, &wrong_shape).await;
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .expect("why")
            .contains("\"l0.weight\" has shape [784, 64]"),
        "{v}"
    );
    let (mut values, _) = server::tensors_file::decode_params(&before, mlp.layout()).expect("ok");
    values[5] = f32::NAN;
    let nan = server::tensors_file::encode_params(
        mlp.layout(),
        &server::tensors_file::le_bytes(&values),
        ("round", "0".into()),
    );
    let (code, v) = put_params(addr, true, &nan).await;
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"].as_str().expect("why").contains("\"l0.weight\""),
        "{v}"
    );
    let (_, _, unchanged) = http_get(addr, "/api/params").await;
    assert_eq!(unchanged, before, "refused uploads changed nothing");
    let halved: Vec<f32> = values
        .iter()
        .map(|v| if v.is_nan() { 0.0 } else { v * 0.5 })
        .collect();
    let upload = server::tensors_file::encode_params(
        mlp.layout(),
        &server::tensors_file::le_bytes(&halved),
        ("round", "0".into()),
    );
    let (code, v) = put_params(addr, true, &upload).await;
    assert_eq!(code, 200, "{v}");
    let (_, _, now) = http_get(addr, "/api/params").await;
    let (now, _) = server::tensors_file::decode_params(&now, mlp.layout()).expect("ok");
    assert_eq!(now, halved, "the uploaded weights, exactly");

    // Push and pull by key: one tensor replaced, the others kept; one tensor fetched.
    let bias: Vec<f32> = (0..10).map(|i| i as f32).collect();
    let bias_bytes = server::tensors_file::le_bytes(&bias);
    let one = server::tensors_file::encode(
        [("l1.bias", &[10usize][..], &bias_bytes[..])],
        ("k", "v".into()),
    );
    let (code, v) = put_params(addr, true, &one).await;
    assert_eq!(code, 200, "{v}");
    let (_, _, after) = http_get(addr, "/api/params").await;
    let (after, _) = server::tensors_file::decode_params(&after, mlp.layout()).expect("ok");
    let l1_bias = mlp.layout().tensors()[3].range();
    assert_eq!(after[l1_bias.clone()], bias[..]);
    assert_eq!(
        after[..l1_bias.start],
        halved[..l1_bias.start],
        "the others kept"
    );
    let (code, _, pulled) = http_get(addr, "/api/params?tensors=l1.bias").await;
    assert_eq!(code, 200);
    let (header, values) = parse_safetensors(&pulled);
    assert_eq!(
        header["l1.bias"]["shape"],
        serde_json::json!([10]),
        "{header}"
    );
    assert!(header.get("l0.weight").is_none(), "{header}");
    assert_eq!(values, bias);
    let (code, _, body) = http_get(addr, "/api/params?tensors=l9.weight").await;
    assert_eq!(code, 404);
    let why: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(
        why["error"],
        "no tensor named \"l9.weight\"; this model has l0.weight, l0.bias, l1.weight, l1.bias"
    );
    let stranger = server::tensors_file::encode(
        [("l7.bias", &[10usize][..], &bias_bytes[..])],
        ("k", "v".into()),
    );
    let (code, v) = put_params(addr, true, &stranger).await;
    assert_eq!(code, 400, "{v}");

    // A learning-rate change shows in the next round.
    let (code, v) = post(addr, "lr", true, r#"{"lr": 0.0005}"#).await;
    assert_eq!(code, 200, "{v}");
    assert!(
        v["done"]
            .as_str()
            .expect("done")
            .contains("0.001 -> 0.0005"),
        "{v}"
    );
    let (code, _) = post(addr, "lr", true, r#"{"lr": -1}"#).await;
    assert_eq!(code, 409);

    let (code, v) = post(addr, "resume", true, "").await;
    assert_eq!(code, 200, "{v}");
    let resumed = log
        .until("the resume", |v| v["fields"]["action"] == "resume")
        .await;
    let rounds_while_paused = log
        .seen
        .iter()
        .skip_while(|v| *v != &paused)
        .take_while(|v| *v != &resumed)
        .filter(|v| v["fields"]["message"] == "round")
        .count();
    assert!(
        rounds_while_paused <= 1,
        "{rounds_while_paused} rounds while paused"
    );
    let next = log.round(1 + still["round"].as_u64().expect("round")).await;
    assert_eq!(
        next["fields"]["lr"].as_f64(),
        Some(f64::from(0.0005f32)),
        "{next}"
    );

    // A checkpoint now.
    let (code, v) = post(addr, "checkpoint", true, "").await;
    assert_eq!(code, 200, "{v}");
    log.until("the checkpoint", |v| {
        v["fields"]["message"] == "checkpoint written"
    })
    .await;

    // Kick: the worker is gone and does not come back by itself.
    let status = get_status_json(addr).await;
    let id = status["worker_list"][0]["id"].as_u64().expect("id");
    let (code, v) = post(addr, "kick", true, &format!(r#"{{"worker": {id}}}"#)).await;
    assert_eq!(code, 200, "{v}");
    removed_with(
        guard("the kicked worker", a).await.expect("task"),
        protocol::ErrorCode::Kicked,
    );
    let gone = log
        .until("the worker leaving", |v| {
            v["fields"]["message"] == "worker left"
        })
        .await;
    assert_eq!(
        gone["fields"]["worker"]
            .as_str()
            .map(|w| w.contains(&id.to_string())),
        Some(true),
        "{gone}"
    );
    assert_eq!(get_status_json(addr).await["workers"], 0);

    // Ban another one; mistakes are refused clearly.
    let b = worker(addr);
    let joined = log
        .until("a second worker", |v| {
            v["fields"]["message"] == "worker joined"
        })
        .await;
    // From the log line itself: the status is published only after the join is logged.
    let id_b: u64 = joined["fields"]["worker"]
        .as_str()
        .and_then(|w| {
            w.trim_start_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("a worker id in {joined}"));
    let (code, v) = post(addr, "ban", true, &format!(r#"{{"worker": {id_b}}}"#)).await;
    assert_eq!(code, 200, "{v}");
    removed_with(
        guard("the banned worker", b).await.expect("task"),
        protocol::ErrorCode::Banned,
    );
    assert_eq!(get_status_json(addr).await["bans"][0], format!("w{id_b}"));
    assert_eq!(post(addr, "kick", true, r#"{"worker": 999}"#).await.0, 409);
    assert_eq!(post(addr, "kick", true, r#"{"who": 1}"#).await.0, 400);
    assert_eq!(post(addr, "reboot", true, "").await.0, 404);

    // Stop: the process exits 0.
    let (code, v) = post(addr, "stop", true, "").await;
    assert_eq!(code, 200, "{v}");
    let exit = guard("exit", child.wait()).await.expect("wait");
    assert!(exit.success(), "{exit}");
    while let Some(line) = log.rx.recv().await {
        log.seen.push(serde_json::from_str(&line).expect("JSON"));
    }
    let logged: Vec<(String, String)> = log
        .seen
        .iter()
        .filter(|v| {
            v["fields"]["message"] == "admin" || v["fields"]["message"] == "admin command refused"
        })
        .map(|v| {
            let from = v["fields"]["from"].as_str().expect("from");
            assert!(from.starts_with("127.0.0.1:"), "who: {v}");
            (
                v["fields"]["action"].as_str().expect("action").to_string(),
                v["fields"]["message"].as_str().expect("m").to_string(),
            )
        })
        .collect();
    for action in [
        "pause",
        "replace_params",
        "lr",
        "resume",
        "checkpoint",
        "kick",
        "ban",
        "stop",
    ] {
        assert!(
            logged.iter().any(|(a, m)| a == action && m == "admin"),
            "{action} logged: {logged:?}"
        );
    }
    assert!(
        logged
            .iter()
            .any(|(a, m)| a == "lr" && m == "admin command refused"),
        "{logged:?}"
    );
}
